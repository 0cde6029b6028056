"""One table from a GPU check's runs (benchmarks/gpu_check.sh): every ablation's rungs with their rate, speed-up,
step alone, wait and copy on the device's timeline and share of the roof, each row checked for agreement
(a wait that leaves its compute above the roof contradicts itself); the selfcheck's verdicts; the machine named.

    python benchmarks/gpu_summary.py OUT.md ABLATION_DIR[:LABEL] ... [--selfcheck DIR] [--peers PEERS_JSON]
                                     [--title TITLE] [--wall NAME=SECONDS ...]
    python benchmarks/gpu_summary.py --best-recipe ABLATION_DIR BASE.yaml COMPILE OUT.yaml

The second form writes the recipe gpu_quick.sh hands to the peers: BASE.yaml with device_decode where the
ablation in ABLATION_DIR found it faster (a firm gain, not noise), and compile on or off (COMPILE: true/false).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def pct(x) -> str:
    return "—" if x is None else f"{100 * x:.0f}%"


def agreement(rung: dict) -> str:
    """'ok', or what contradicts: the report's own check (report.notes.roof_contradiction: the compute part of
    the step, neither waiting nor copying, above the roof)."""
    from types import SimpleNamespace

    from trainfast.report.notes import roof_contradiction

    wait, roof = rung.get("data_wait_fraction"), rung.get("ceiling_fraction")
    if wait is None or not roof:
        return "—"
    fields = SimpleNamespace(data_wait_fraction=wait, copy_fraction=rung.get("copy_fraction"), ceiling_fraction=roof)
    contradiction = roof_contradiction(fields)
    if contradiction:
        return "contradiction: " + contradiction
    compute = 1 - wait - (rung.get("copy_fraction") or 0.0)
    return f"ok (compute at {100 * roof / compute:.0f}% of the roof)" if compute > 0 else "— (all of it waiting)"


def ablation_table(folder: Path, label: str) -> list[str]:
    data = json.loads((folder / "results.json").read_text())
    env, settings = data["environment"], data["settings"]
    roofs = ", ".join(f"{k} {v / 1e12:,.1f} TFLOP/s" for k, v in data["ceilings_flops_per_s"].items())
    lines = [f"### {label}", "",
             f"{settings.get('model')} on {settings.get('data')} at {settings.get('image_size')} px; "
             f"{env.get('device_name')}, torch {env.get('torch')}, {env.get('cpu_cores')} cores; roofs {roofs}"
             + (" (fp32 against TF32's)" if settings.get("fp32_roof") == "tf32" else "")
             + f"; recommended: {data['best']['name']}", "",
             "| rung | samples/s | speed-up | verdict | step alone (speed-up) | epoch / step alone | wait | copy "
             "| % of roof | row agrees |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in data["rungs"]:
        if r["status"] != "done":
            lines.append(f"| {r['name']} | {r['verdict'] or r['status']} |  |  |  |  |  |  |  |  |")
            continue
        alone = "—" if not r.get("step_alone") else f"{r['step_alone']:,.0f} ({r.get('step_alone_speedup') or 1:.2f}x)"
        lines.append(f"| {r['name']} | {r['throughput']:,.0f} ± {r['throughput_spread'] or 0:,.0f} | "
                     f"{r['speedup']:.2f}x | {r['verdict']} | {alone} | {pct(r.get('epoch_of_step'))} | "
                     f"{pct(r.get('data_wait_fraction'))} | {pct(r.get('copy_fraction'))} | "
                     f"{pct(r.get('ceiling_fraction'))} | {agreement(r)} |")
    return lines + [""]


def selfcheck_table(folder: Path) -> list[str]:
    data = json.loads((folder / "selfcheck.json").read_text())
    lines = ["### selfcheck", "", "| check | status | figure |", "|---|---|---|"]
    for c in data.get("checks", data.get("results", [])):
        lines.append(f"| {c.get('name')} | {c.get('status')} | {c.get('detail') or c.get('figure') or ''} |")
    return lines + [""]


def best_recipe(folder: Path, base: Path, compile_: bool, out: Path) -> str:
    """BASE plus device_decode where the ablation's device_decode rung was faster than the baseline, plus
    compile as asked; what was decided, in words."""
    import yaml

    recipe = yaml.safe_load(base.read_text()) or {}
    try:
        rungs = {r["name"]: r for r in json.loads((folder / "results.json").read_text())["rungs"]}
        rung = rungs.get("device_decode", {})
        faster = rung.get("status") == "done" and str(rung.get("verdict") or "").startswith("faster")
        why = f"device_decode: {rung.get('verdict') or rung.get('status') or 'not run'}"
    except (OSError, KeyError, ValueError) as exc:
        faster, why = False, f"device_decode: no result ({exc})"
    recipe["device_decode"] = faster
    recipe["compile"] = compile_
    out.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return f"best recipe: {why}, so device_decode={faster}; compile={compile_} -> {out}"


def peers_table(path: Path) -> list[str]:
    """The peers' run (peers.py): each tool's steady epochs and whole process, and trainfast's recipe against each
    peer, per round."""
    data = json.loads(path.read_text())
    lines = [f"### trainfast's recipe beside the peers ({data.get('machine')}, {data.get('precision')})", "",
             "| workload | tool | images/s, steady epochs | steady epoch | whole process |", "|---|---|---|---|---|"]
    for name, w in data["workloads"].items():
        for tool, seconds in w["median_per_epoch_s"].items():
            whole = w.get("median_whole_process_s", {}).get(tool)
            lines.append(f"| {name} | {tool} | {w['median_images_per_s'][tool]:,.0f} | {seconds:.2f} s | "
                         + ("—" if whole is None else f"{whole:.1f} s") + " |")
        for pair in w.get("recipe_against", []):
            steady = ", ".join(f"{r:.2f}x" for r in pair["steady_epoch_speedup"]) or "—"
            procs = ", ".join(f"{r:.2f}x" for r in pair["whole_process_speedup"]) or "—"
            lines += ["", f"trainfast's recipe against {pair['peer']}: steady epochs {steady}, whole process {procs} "
                          f"({pair['text']})"]
    return lines + [""]


def main() -> None:
    if sys.argv[1:2] == ["--best-recipe"]:
        folder, base, compile_, out = sys.argv[2:6]
        print(best_recipe(Path(folder), Path(base), compile_ == "true", Path(out)))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("ablations", nargs="*")
    parser.add_argument("--selfcheck", default=None)
    parser.add_argument("--peers", default=None, help="peers.json of a benchmarks/peers.py run")
    parser.add_argument("--title", default="GPU check")
    parser.add_argument("--wall", action="append", default=[], help="NAME=SECONDS: a step's wall time")
    args = parser.parse_args()
    lines = [f"# {args.title}", ""]
    for item in args.wall:
        name, _, seconds = item.partition("=")
        lines.append(f"- {name}: {seconds} s wall")
    lines.append("")
    for spec in args.ablations:
        folder, _, label = spec.partition(":")
        try:
            lines += ablation_table(Path(folder), label or folder)
        except (OSError, KeyError, ValueError) as exc:
            lines += [f"### {label or folder}", "", f"no results: {exc}", ""]
    if args.peers:
        try:
            lines += peers_table(Path(args.peers))
        except (OSError, KeyError, ValueError) as exc:
            lines += ["### peers", "", f"no results: {exc}", ""]
    if args.selfcheck:
        try:
            lines += selfcheck_table(Path(args.selfcheck))
        except (OSError, KeyError, ValueError) as exc:
            lines += ["### selfcheck", "", f"no results: {exc}", ""]
    text = "\n".join(lines)
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
