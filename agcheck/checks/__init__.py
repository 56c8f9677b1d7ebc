"""The checks that accompany the Jacobian comparison, one module each."""
