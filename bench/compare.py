"""Side-by-side benchmark: ``agcheck.gradcheck`` vs ``torch.autograd.gradcheck``.

    python bench/compare.py [--cases a,b,...] [--repeat N] [--quick] [--json out.json]
                            [--timeout S] [--opinfo-ops N] [--list]

Every (case, side, repetition) runs in its own fresh process (``bench/cases.py --worker``),
so neither side inherits the other's allocator state, caches or peak RSS.  Sides are
interleaved (torch, agcheck, torch, agcheck, ...) so machine drift hits both alike.  With
``--repeat N`` the table shows the median time and median peak over the N runs.

Columns: torch / agcheck wall time of the check only; ``speed`` = torch time / agcheck
time (> 1: agcheck faster); torch / agcheck peak RSS growth during the check in MiB;
``mem`` = torch peak / agcheck peak (> 1: agcheck leaner); ``agree`` = same verdict.
See bench/README.md.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from cases import CASES, MARKER  # noqa: E402
from precompile import compile_agcheck  # noqa: E402

SIDES = ("torch", "agcheck")


def run_one(case: str, side: str, *, quick: bool, timeout: float, opinfo_ops: int | None,
            opinfo_source: str = "auto", threads: int | None = None, cold: bool = False) -> dict:
    """Run one case on one side in a fresh interpreter (``cold``: with no warm-up); return
    the worker's record, or a record with ``verdict`` "timeout" / "crash"."""
    cmd = [sys.executable, os.path.join(HERE, "cases.py"), "--worker", case, "--side", side]
    if quick:
        cmd.append("--quick")
    if cold:
        cmd.append("--cold")
    if opinfo_ops is not None:
        cmd += ["--opinfo-ops", str(opinfo_ops)]
    if CASES[case].check == "sweep":
        cmd += ["--opinfo-source", opinfo_source]
    env = None
    if threads is not None:
        cmd += ["--threads", str(threads)]
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env=env)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # the worker is a plain python process we started; kill its own process group
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.communicate()
        return {"case": case, "side": side, "verdict": "timeout", "time_s": None, "peak_mb": None,
                "wall_s": time.perf_counter() - t0}
    wall = time.perf_counter() - t0
    for line in out.splitlines():
        if line.startswith(MARKER):
            rec = json.loads(line[len(MARKER):])
            rec["wall_s"] = wall
            return rec
    tail = "\n".join(err.strip().splitlines()[-15:])
    verdict = "killed(OOM?)" if proc.returncode == -signal.SIGKILL else f"crash(rc={proc.returncode})"
    return {"case": case, "side": side, "verdict": verdict, "time_s": None, "peak_mb": None,
            "wall_s": wall, "stderr_tail": tail}


def source_digest() -> str:
    """Short sha256 of agcheck's sources (agcheck/ *.py), so a table can be
    tied to the exact code even when the working tree is dirty."""
    import hashlib

    root = os.path.dirname(HERE)
    h = hashlib.sha256()
    for sub in ("agcheck",):
        for dirpath, dirnames, files in sorted(os.walk(os.path.join(root, sub))):
            dirnames.sort()
            for fname in sorted(files):
                if fname.endswith(".py"):
                    path = os.path.join(dirpath, fname)
                    h.update(os.path.relpath(path, root).encode())
                    with open(path, "rb") as f:
                        h.update(f.read())
    return h.hexdigest()[:12]


def _median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def summarize(runs: list[dict]) -> dict:
    """Median time / peak over repetitions; the verdict of the first run (all runs'
    verdicts are kept; differing verdicts across runs are flagged)."""
    verdicts = [r["verdict"] for r in runs]
    s = {
        "time_s": _median(r.get("time_s") for r in runs),
        "cpu_s": _median(r.get("cpu_s") for r in runs),
        "warm_cpu_s": _median(r.get("warm_cpu_s") for r in runs),
        "peak_mb": _median(r.get("peak_mb") for r in runs),
        "file_mb": _median(r.get("file_mb") for r in runs),
        "anon_mb": _median(r.get("anon_mb") for r in runs),
        "verdict": verdicts[0],
        "verdicts_all_runs": verdicts,
        "stable": len(set(verdicts)) == 1,
        "runs": runs,
    }
    return s


def _agree(t: dict, a: dict) -> tuple[str, str]:
    """(yes/no/n/a, note)."""
    tv, av = t["verdict"], a["verdict"]
    if av == "n/a":
        return "n/a", "agcheck has no such entry point"
    if "timeout" in (tv, av) or tv.startswith(("crash", "killed")) or av.startswith(("crash", "killed")):
        return "n/a", f"torch={tv} agcheck={av}"
    tr, ar = t["runs"][0], a["runs"][0]
    if "verdicts" in tr and "verdicts" in ar:  # sweep: per-sample comparison
        tl = [i["label"] for i in tr["items"]]
        al = [i["label"] for i in ar["items"]]
        if tl != al:
            return "no", "sweep sample lists differ"
        bad = [f"{i['label']}: torch={i['verdict']} agcheck={j['verdict']}"
               for i, j in zip(tr["items"], ar["items"]) if i["verdict"] != j["verdict"]]
        return ("no", "; ".join(bad)) if bad else ("yes", "")
    if not (t["stable"] and a["stable"]):
        return "no", f"verdicts vary across runs: torch={t['verdicts_all_runs']} agcheck={a['verdicts_all_runs']}"
    return ("yes", "") if tv == av else ("no", f"torch={tv} agcheck={av}")


def _fmt_t(x):
    return "-" if x is None else (f"{x:.3f}" if x < 10 else f"{x:.2f}")


def _fmt_mb(x):
    return "-" if x is None else (f"{x:.1f}" if x < 1000 else f"{x:.0f}")


def _ratio(num, den, *, floor=0.0):
    if num is None or den is None:
        return None
    if den <= floor:
        return None
    return num / den


def _fmt_r(x):
    return "-" if x is None else f"{x:.2f}x"


MEM_FLOOR_MB = 1.0  # below this the RSS delta is page-granularity noise; no ratio


def _speed(t: dict, a: dict, timeout: float) -> str:
    """torch/agcheck time; when exactly one side timed out, a bound from the timeout
    (which also covers the worker's start-up, so the bound is loose)."""
    if t["verdict"] == "timeout" and a["time_s"]:
        return f">{timeout / a['time_s']:.0f}x"
    if a["verdict"] == "timeout" and t["time_s"]:
        return f"<{t['time_s'] / timeout:.2f}x"
    return _fmt_r(_ratio(t["time_s"], a["time_s"]))


def _mem_ratio(t: dict, a: dict, key: str = "peak_mb"):
    if t.get(key) is None or a.get(key) is None or max(t[key], a[key]) < MEM_FLOOR_MB:
        return None
    return t[key] / max(a[key], 0.1)


def render(results: list[dict], header: str, timeout: float = 600.0) -> str:
    cold = any("cold" in r for r in results)
    cols = ["case", "work", "torch s", "agcheck s", "speed", "cpu speed", "warm cpu speed", "torch MB",
            "agcheck MB", "mem", "torch file MB", "agcheck file MB", "torch anon MB", "agcheck anon MB",
            "anon mem"]
    cols += ["cold torch s", "cold agcheck s", "cold speed", "cold mem"] if cold else []
    cols += ["torch verdict", "agcheck verdict", "agree"]
    rows = []
    for r in results:
        t, a = r["torch"], r["agcheck"]
        row = [
            r["case"], r["detail"], _fmt_t(t["time_s"]), _fmt_t(a["time_s"]),
            _speed(t, a, timeout), _fmt_r(_ratio(t["cpu_s"], a["cpu_s"])),
            _fmt_r(_ratio(t.get("warm_cpu_s"), a.get("warm_cpu_s"))), _fmt_mb(t["peak_mb"]), _fmt_mb(a["peak_mb"]),
            _fmt_r(_mem_ratio(t, a)), _fmt_mb(t.get("file_mb")), _fmt_mb(a.get("file_mb")),
            _fmt_mb(t.get("anon_mb")), _fmt_mb(a.get("anon_mb")), _fmt_r(_mem_ratio(t, a, "anon_mb")),
        ]
        if cold:
            ct, ca = r["cold"]["torch"], r["cold"]["agcheck"]
            row += [_fmt_t(ct["time_s"]), _fmt_t(ca["time_s"]), _speed(ct, ca, timeout), _fmt_r(_mem_ratio(ct, ca))]
        row += [t["verdict"], a["verdict"], r["agree"].upper() if r["agree"] == "no" else r["agree"]]
        rows.append(row)
    widths = [max(len(c), *(len(row[i]) for row in rows)) if rows else len(c) for i, c in enumerate(cols)]
    right = set(range(2, len(cols) - 3))

    def line(cells):
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    out = [header, "", line(cols), line(["-" * w for w in widths])]
    out += [line(row) for row in rows]
    tt = [r["torch"]["time_s"] for r in results]
    at = [r["agcheck"]["time_s"] for r in results]
    both = [(x, y) for x, y in zip(tt, at) if x is not None and y is not None]
    if both:
        sx, sy = sum(x for x, _ in both), sum(y for _, y in both)
        out.append("")
        out.append(f"total over cases timed on both sides: torch {sx:.2f} s, agcheck {sy:.2f} s, "
                   f"speed {sx / sy:.2f}x" if sy > 0 else "")
        ratios = [x / y for x, y in both if y > 0]
        if ratios:
            gm = statistics.geometric_mean(ratios)
            out.append(f"geometric mean of per-case speed ratios: {gm:.2f}x")
    bad = [r for r in results if r["agree"] == "no"]
    if bad:
        out.append("")
        out.append("!" * 78)
        out.append(f"!!! VERDICT DISAGREEMENT in {len(bad)} case(s):")
        for r in bad:
            out.append(f"!!!   {r['case']}: {r['note']}")
        out.append("!" * 78)
    for r in results:  # where the sweep's time goes: the samples with the largest gaps
        tr, ar = r["torch"]["runs"][0], r["agcheck"]["runs"][0]
        if "items" in tr and "items" in ar and [i["label"] for i in tr["items"]] == [i["label"] for i in ar["items"]]:
            gaps = sorted(zip(tr["items"], ar["items"]), key=lambda p: -abs(p[1]["time_s"] - p[0]["time_s"]))[:5]
            out.append("")
            out.append(f"{r['case']}: samples with the largest time gaps (torch s / agcheck s):")
            for x, y in gaps:
                out.append(f"    {x['label']:48s} {x['time_s']:8.3f} / {y['time_s']:8.3f}")
    notes = [r for r in results if r["agree"] != "no" and r["note"]]
    for r in notes:
        out.append(f"note: {r['case']}: {r['note']}")
    for r in results:
        for side in ("torch", "agcheck"):
            run = r[side]["runs"][0]
            if run.get("stderr_tail"):
                out.append(f"--- {r['case']} / {side} stderr (last lines):")
                out.append(run["stderr_tail"])
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="agcheck vs torch.autograd.gradcheck benchmark")
    p.add_argument("--cases", default=None, help="comma-separated case names (default: all); see --list")
    p.add_argument("--repeat", type=int, default=1, help="runs per case and side (median reported)")
    p.add_argument("--quick", action="store_true", help="small sizes: whole table in < 2 min")
    p.add_argument("--json", default=None, help="write all raw records to this file")
    p.add_argument("--timeout", type=float, default=600.0, help="per case, side and run, seconds")
    p.add_argument("--opinfo-ops", type=int, default=None,
                   help="ops in the OpInfo sweep (default 60, 10 with --quick)")
    p.add_argument("--opinfo-source", choices=["auto", "sweep", "own"], default="auto",
                   help="build the sweep with tests/opinfo_sweep.py (sweep), bench/cases.py (own), "
                        "or the former when usable (auto)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch intra-op threads in the workers (default: torch's default); "
                        "1 gives steadier numbers on a busy machine")
    p.add_argument("--cold", action="store_true",
                   help="also time each case as the first check of a fresh process (no warm-up at all): "
                        "columns 'cold ...'")
    p.add_argument("--list", action="store_true", help="list cases and exit")
    a = p.parse_args(argv)

    if a.list:
        for name, c in CASES.items():
            print(f"{name:16s} {c.describe(False, {})}   | quick: {c.describe(True, {})}")
        return 0
    names = list(CASES) if not a.cases else [n.strip() for n in a.cases.split(",") if n.strip()]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        p.error(f"unknown case(s) {unknown}; known: {', '.join(CASES)}")
    opts = {} if a.opinfo_ops is None else {"opinfo_ops": a.opinfo_ops}

    print(compile_agcheck(), flush=True)
    import torch  # only for the header

    try:
        import agcheck
        ag_ver = agcheck.__version__
        has_gg = hasattr(agcheck, "gradgradcheck")
    except Exception as e:  # noqa: BLE001
        ag_ver, has_gg = f"import failed: {type(e).__name__}", False
    git = ""
    try:
        git = subprocess.run(["git", "-C", os.path.dirname(HERE), "describe", "--always", "--dirty"],
                             capture_output=True, text=True, timeout=10).stdout.strip()
    except Exception:  # noqa: BLE001
        pass
    digest = source_digest()
    header = (f"agcheck {ag_ver} ({git}, sources {digest}) vs torch {torch.__version__}; python {platform.python_version()}; "
              f"{os.cpu_count()} cpus, torch threads {a.threads or torch.get_num_threads()}; "
              f"{'quick' if a.quick else 'full'} sizes; repeat {a.repeat}; timeout {a.timeout:.0f} s; "
              f"agcheck.gradgradcheck {'present' if has_gg else 'absent'}\n"
              f"time = perf_counter around the check only (the first check of the case in a fresh "
              f"process, after one plain backward with an explicit cotangent and a tiny warm-up check)"
              f"{'; cold = the same with no warm-up at all (the first check of the process)' if a.cold else ''}; warm = CPU time of the same check run again in that "
              f"process; peak = max RSS growth during the first check (MiB); file = the part of its RSS growth that is "
              f"file-backed pages (shared-library code touched for the first time, not allocations); anon = peak growth of "
              f"the anonymous RSS (allocations), sampled every 0.2 ms by a separate process; speed/mem = torch/agcheck "
              f"(>1: agcheck better)")
    print(header, flush=True)

    results = []
    t_start = time.perf_counter()
    for name in names:
        runs = {s: [] for s in SIDES}
        for _ in range(a.repeat):
            for side in SIDES:
                rec = run_one(name, side, quick=a.quick, timeout=a.timeout, opinfo_ops=a.opinfo_ops,
                              opinfo_source=a.opinfo_source, threads=a.threads)
                runs[side].append(rec)
                la = rec.get("loadavg_before")
                print(f"  {name:16s} {side:8s} time={_fmt_t(rec.get('time_s')):>8s} s  "
                      f"cpu={_fmt_t(rec.get('cpu_s')):>8s} s  warm cpu={_fmt_t(rec.get('warm_cpu_s')):>8s} s  "
                      f"peak={_fmt_mb(rec.get('peak_mb')):>7s} MB (file {_fmt_mb(rec.get('file_mb'))}, "
                      f"anon {_fmt_mb(rec.get('anon_mb'))})  "
                      f"verdict={rec['verdict']}  "
                      f"(process {rec.get('wall_s', 0):.1f} s, load {'-' if la is None else f'{la:.1f}'})",
                      flush=True)
        t, ag = summarize(runs["torch"]), summarize(runs["agcheck"])
        agree, note = _agree(t, ag)
        cold = None
        if a.cold:
            cold_runs = {s: [] for s in SIDES}
            for _ in range(a.repeat):
                for side in SIDES:
                    rec = run_one(name, side, quick=a.quick, timeout=a.timeout, opinfo_ops=a.opinfo_ops,
                                  opinfo_source=a.opinfo_source, threads=a.threads, cold=True)
                    cold_runs[side].append(rec)
                    print(f"  {name:16s} {side:8s} cold time={_fmt_t(rec.get('time_s')):>8s} s  "
                          f"peak={_fmt_mb(rec.get('peak_mb')):>7s} MB  verdict={rec['verdict']}", flush=True)
            cold = {s: summarize(cold_runs[s]) for s in SIDES}
            cold_agree, cold_note = _agree(cold["torch"], cold["agcheck"])
            if cold_agree == "no" and agree != "no":
                agree, note = "no", f"cold runs: {cold_note}"
        if agree == "no":
            print(f"  !!! VERDICT DISAGREEMENT in {name}: {note}", flush=True)
        results.append({"case": name, "detail": CASES[name].describe(a.quick, opts),
                         "torch": t, "agcheck": ag, "agree": agree, "note": note})
        if cold is not None:
            results[-1]["cold"] = cold

    table = render(results, header, a.timeout)
    if source_digest() != digest:
        table += ("\nWARNING: agcheck's sources changed while the bench ran "
                  f"({digest} -> {source_digest()}): cases may have run different code.")
    loads = [r2.get("loadavg_before") for r in results for side in SIDES for r2 in r[side]["runs"]]
    loads = [x for x in loads if x is not None]
    if loads and max(loads) > (os.cpu_count() or 1):
        table += (f"\nWARNING: the machine was busy (1-min load average up to {max(loads):.1f} on "
                  f"{os.cpu_count()} cpus): wall times are inflated unevenly; compare 'cpu speed' too, "
                  f"or rerun with --repeat on a quiet machine.")
    src = [r["agcheck"]["runs"][0].get("sweep_source") or r["torch"]["runs"][0].get("sweep_source")
           for r in results if CASES[r["case"]].check == "sweep"]
    if src and src[0]:
        table += f"\nopinfo_sweep built by: {src[0]}"
    print()
    print(table)
    print(f"\n(bench wall time {time.perf_counter() - t_start:.1f} s)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"header": header, "quick": a.quick, "repeat": a.repeat, "results": results}, f, indent=1)
    return 1 if any(r["agree"] == "no" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
