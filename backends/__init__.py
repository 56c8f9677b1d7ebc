"""agcheck's backends: one module per array framework, imported only when used."""
