"""trainfast against what users run today, side by side on the same model, data and settings.

Per tool and workload, the per-epoch cost by whole-process timing: the wall time of an E_long-epoch run minus
that of an E_short-epoch run, divided by the extra epochs, so interpreter start-up, imports, model build,
worker start and warm-up cancel. Every tool evaluates val/ once per epoch and writes one checkpoint per epoch
(what timm's train.py and Lightning do by default). Runs are interleaved: in repeat r each tool runs its short and
its long run back to back (short first in even repeats, long first in odd ones), each trainfast tool next to the
peer it is compared with (so a pair's runs are minutes apart, not a round apart), the pairs in an order rotated
from one repeat to the next and who goes first in a pair alternating. A machine drifts over minutes (seen on a
shared VM: the same epoch of the same tool 1.3x slower in a run minutes later); with every short run first and
every long run after, a tool's two runs were minutes apart and the drift between them landed in its difference
(trainfast + channels_last: 20.1 s an epoch that way, 17.9-18.2 s from runs back to back, with epochs of 18.4 s
timed inside the process). The per-epoch costs are medians over repeats. With one epoch count (--epochs N, the
quick GPU mode) each tool runs once a round, and its per-epoch cost is its epochs after the first, inside the run.

Beside the wall time, the CPU time of the whole process tree (the tool and its loader workers, user + system,
from getrusage of the finished process) by the same difference: the core-seconds an epoch costs, and that over
the cores times the per-epoch wall time, how busy the machine was. When every tool keeps the cores busy, the
per-epoch cost is the CPU work an epoch needs over the cores: same switches, same arithmetic, same cost, and only
less work (not better overlap) can make an epoch cheaper. An OpenMP thread spinning while it waits for work
counts as busy (the default wait policy spins; passive_threads sleeps).

Each tool also reports its epochs' own seconds (training and evaluation, timed inside the process: the plain
loop and the Lightning callback print them, trainfast writes metrics.jsonl); the table shows the last epoch of
the long run beside the whole-process cost. Where the two disagree, the machine drifted between the runs.

A second estimate of the same per-epoch cost comes from inside the long run alone: every line a tool prints is
stamped as it arrives, each epoch's end is found from its lines (epoch_marks: trainfast's "epoch N:" line, the
plain loop's and the Lightning callback's JSON record, timm's last "Test:" line of an evaluation), and the time
from the first epoch's end to the last, over the epochs between, is whole epochs of training, evaluation and
checkpoint in one process. It leaves out start-up and the first epoch, as the difference does, but it is read
from one process instead of two, so it carries one run's noise instead of the difference of two runs' noise;
the pairs' verdicts are given on both.

Tools (a `-cl` suffix: the same tool with channels_last, its one switch every tool has, so a speed-up that is
only the switch trainfast found is told apart from running the same switches faster):
  timm       timm's own train.py (--timm-train PATH: a checkout of pytorch-image-models; it is not part of the
             pip package): `--amp --amp-dtype bfloat16 --device cpu --opt adamw`, its own loader, evaluation
             and checkpoint every epoch, color jitter off (trainfast's crop has none); timm-cl adds
             `--channels-last`
  plain      benchmarks/peers/plain_timm_style.py: timm train.py `--amp` reduced to this workload (torchvision
             ImageFolder pipeline, autocast, GradScaler with fp16)
  lightning  benchmarks/peers/lightning_trainer.py: a Lightning Trainer, precision="bf16-mixed" (its best flag
             on a CPU with fast bf16), a checkpoint every epoch (its default); `lightning` is installed into
             benchmarks/.peers-lib on first use where it is not importable
  trainfast  `trainfast train --precision bf16`: the same settings, no other technique (Lightning's switches:
             its batches are normalized floats made in the workers); trainfast-pf adds `--prefetch`, which is
             what timm's train.py does by default (its prefetcher: uint8 batches, normalized in the training
             process), so trainfast-pf and trainfast-pf-cl run timm's switches
  tuned      `trainfast train --recipe FILE` (--tuned-recipe, e.g. the best.yaml of `trainfast tune` on this
             workload, or benchmarks/recipes/); model, data, batch size, epochs, lr and workers are set here, the
             rest from FILE. Run once untimed before the rounds (a decode cache is built on the first run)

Every tool drops the last partial training batch, so an epoch trains the same images in each; the table gives
images per second (those images over the per-epoch cost) beside the seconds. Under it, each trainfast tool
against each peer that runs the same switches (SAME_SWITCHES): the per-round ratios and a verdict by the
ablation's statistics, so a difference inside the machine's round-to-round noise is called that.

`--precision` (default auto: bf16 where this CPU computes it fast, else fp32, as `trainfast ablate` measures
it) is the one precision every tool runs in: on a CPU without bf16 hardware autocast makes every step ~10x
slower, and no user would run any of the three tools that way.

    PYTHONPATH=src python benchmarks/peers.py --workloads r18-128 --repeats 2
    PYTHONPATH=src python benchmarks/peers.py --tuned-recipe runs/tune-r18/best.yaml --workloads r18-128

On one GPU (what benchmarks/gpu_check.sh runs): timm's train.py with its best flags beside trainfast's best recipe,
on a generated folder of 320x256 JPEGs, 12 workers each:

    PYTHONPATH=src python benchmarks/peers.py --device cuda --workers 12 --workloads r50-224 \
        --jpeg-folder /tmp/jpegs --tools timm-cl,timm-tc-cl --timm-train PATH/train.py \
        --tuned-recipe benchmarks/recipes/r50-224-gpu.yaml --epochs 1,3 --repeats 2

Nothing else may run on the machine meanwhile: these are wall-clock timings.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
LIB = HERE / ".peers-lib"
WORKLOADS = {                       # name -> (timm model, image size, batch size, training photos)
    "vit-224": ("vit_small_patch16_224", 224, 32, 320),
    "r18-224": ("resnet18", 224, 64, 1596),
    "r18-128": ("resnet18", 128, 128, 1596),
    # The GPU workload (--device cuda --jpeg-folder PATH): 320x256 JPEGs made by make_jpeg_folder.py, 10 classes.
    "r50-224": ("resnet50", 224, 256, 19200),
    # gpu_quick.sh's CPU smoke mode: the same steps, small enough for a CPU in seconds.
    "r18-32": ("resnet18", 32, 32, 64),
}
# timm-tc-cl: timm's best flags on a GPU, --torchcompile --channels-last (with bf16 AMP and --pin-mem there).
TOOLS = ("timm", "timm-cl", "timm-tc-cl", "plain", "lightning", "lightning-cl", "trainfast", "trainfast-cl",
         "trainfast-pf", "trainfast-pf-cl", "tuned")
LIGHTNING = ["lightning==2.6.*", "lightning-utilities", "fsspec", "tqdm"]


def ensure_lightning() -> None:
    """lightning into its own folder, without dependencies trainfast's environment already has (torch,
    torchmetrics, PyYAML, packaging): the peer runs on the same torch build as the others."""
    probe = subprocess.run([sys.executable, "-c", "import lightning"], env=env_for("lightning"), capture_output=True)
    if probe.returncode == 0:
        return
    print(f"installing {' '.join(LIGHTNING)} into {LIB} (not a trainfast dependency)", flush=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(LIB), *LIGHTNING],
                   check=True)


def env_for(tool: str) -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(ROOT / "src")] + ([str(LIB)] if tool == "lightning" else [])
    env["PYTHONPATH"] = os.pathsep.join(paths + [env["PYTHONPATH"]] if env.get("PYTHONPATH") else paths)
    env.pop("TRAINFAST_RECIPE", None)
    return env


def command(tool: str, workload: str, data: Path, epochs: int, out: Path, tuned: Path | None,
            precision: str = "bf16", timm_train: Path | None = None, device: str = "cpu",
            workers: int = 2) -> list[str]:
    model, size, batch, _ = WORKLOADS[workload]
    base, *flags = tool.split("-")
    channels_last = "cl" in flags
    if base == "timm":
        amp = {"bf16": ["--amp", "--amp-dtype", "bfloat16"], "fp16": ["--amp"], "fp32": []}[precision]
        # On a GPU: its pinned-memory loader (its prefetcher is on by default) and the bilinear crop and no label
        # smoothing that trainfast's run has; --torchcompile with the tc flag.
        gpu = (["--pin-mem", "--train-interpolation", "bilinear", "--smoothing", "0"] if device != "cpu" else [])
        return [sys.executable, str(timm_train), "--data-dir", str(data), "--val-split", "val", "--model", model,
                "--img-size", str(size), "-b", str(batch), "--epochs", str(epochs), "--workers", str(workers),
                "--device", device, "--opt", "adamw", "--lr", "2e-3", "--weight-decay", "0.05", "--color-jitter", "0",
                "--checkpoint-hist", "1", "--output", str(out.parent), "--experiment", out.name, *amp, *gpu,
                *class_flag(data)] + (["--channels-last"] if channels_last else []) \
            + (["--torchcompile"] if "tc" in flags else [])
    if base in ("plain", "lightning"):
        script = HERE / "peers" / ("plain_timm_style.py" if base == "plain" else "lightning_trainer.py")
        return [sys.executable, str(script), "--data", str(data), "--model", model, "--image-size", str(size),
                "--batch-size", str(batch), "--epochs", str(epochs), "--workers", str(workers), "--precision",
                precision,
                "--out", str(out)] + (["--channels-last"] if channels_last else [])
    cmd = [sys.executable, "-m", "trainfast", "train", "--model", model, "--data", f"imagefolder:{data}",
           "--image-size", str(size), "--batch-size", str(batch), "--epochs", str(epochs), "--num-workers",
           str(workers), "--persistent-workers", "--device", device, "--out", str(out)]
    if base == "tuned":
        return cmd + ["--recipe", str(tuned)]
    return (cmd + ["--precision", precision] + (["--prefetch"] if "pf" in flags else [])
            + (["--channels-last"] if channels_last else []))


def class_flag(data: Path) -> list[str]:
    """timm's --num-classes for the folder (its default is ImageNet's 1000), once the folder exists."""
    train = data / "train"
    if not train.is_dir():
        return []
    return ["--num-classes", str(sum(1 for p in train.iterdir() if p.is_dir() and not p.name.startswith(".")))]


def jpeg_folder(path: Path, images: int) -> Path:
    """train/ and val/ of generated 320x256 JPEGs (benchmarks/make_jpeg_folder.py), made once and reused."""
    sys.path.insert(0, str(HERE))
    from make_jpeg_folder import make_jpeg_folder

    if not (path / "val").is_dir():
        make_jpeg_folder(path, train=images, val=max(64, images // 30))
    return path


def images_per_epoch(workload: str, images: int) -> int:
    """Every tool here drops the last partial training batch (static shapes): full batches only."""
    batch = WORKLOADS[workload][2]
    return images // batch * batch


def resolve_precision(choice: str) -> str:
    """auto: bf16 unless this CPU runs it slower than fp32 (measured as the ablation does), then fp32."""
    if choice != "auto":
        return choice
    import torch

    from trainfast.techniques.precision import slow_half_reason

    reason = slow_half_reason(torch.device("cpu"), "bf16")
    if reason:
        print(f"--precision auto: fp32, as {reason}", flush=True)
    return "fp32" if reason else "bf16"


def run_once(cmd: list[str], tool: str, log: Path) -> tuple[float, float | None, list[float], float, list[float]]:
    """Wall seconds of the whole process, the final val accuracy it printed (None if it printed none), its
    epochs' own seconds, the CPU seconds of the process and every child it waited for (its workers), and the
    moment (seconds from the start) each epoch's end marker line reached us (epoch_marks)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env_for(tool), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: dict[str, list[tuple[float, str]]] = {"stdout": [], "stderr": []}

    def read(name: str) -> None:        # each line stamped as it arrives: every tool flushes its epoch lines
        for line in getattr(proc, name):
            lines[name].append((time.perf_counter() - start, line))

    readers = [threading.Thread(target=read, args=(name,), daemon=True) for name in lines]
    for reader in readers:
        reader.start()
    proc.wait()
    for reader in readers:
        reader.join()
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    stdout, stderr = ("".join(text for _, text in lines[name]) for name in ("stdout", "stderr"))
    log.write_text(stdout + stderr)
    if proc.returncode != 0:
        raise SystemExit(f"{tool} failed (exit {proc.returncode}); log: {log}\n{(stdout + stderr)[-2000:]}")
    records = json_lines(stdout, cmd)
    epoch_s = [r["epoch_time_s"] for r in records if "epoch_time_s" in r]
    marks = epoch_marks(sorted(lines["stdout"] + lines["stderr"]))
    return (seconds, next((r["val_accuracy"] for r in reversed(records) if "val_accuracy" in r), None), epoch_s, cpu,
            marks)


EPOCH_LINE = re.compile(r'^(epoch \d+:|\{"epoch": \d+)')     # trainfast train; the plain loop and Lightning (JSON)


def epoch_marks(lines: list[tuple[float, str]]) -> list[float]:
    """When each epoch ended, from the lines a run printed, stamped as they arrived: trainfast's "epoch N: ..." and
    the plain loop's and Lightning callback's JSON record come once an epoch's evaluation is done; timm's train.py
    prints no such line, so its epoch ends at its last "Test:" line (its evaluation's last batch) before the next
    "Train:" line. Each marks the same point of an epoch's cycle in every run of that tool, so the time between
    two marks k epochs apart is k whole epochs (training, evaluation, checkpoint) inside one process."""
    marks, last_test = [], None
    for t, line in lines:
        if EPOCH_LINE.match(line):
            marks.append(t)
        elif line.startswith("Test:"):
            last_test = t
        elif line.startswith("Train:") and last_test is not None:
            marks.append(last_test)
            last_test = None
    return marks + ([last_test] if last_test is not None else [])


def in_run_epoch(marks: list[float]) -> float | None:
    """The per-epoch cost inside one run: first epoch end to last over the epochs between (no start-up, no first
    epoch, one process: none of the two runs' start-up noise the whole-process difference carries)."""
    return (marks[-1] - marks[0]) / (len(marks) - 1) if len(marks) >= 2 else None


def json_lines(stdout: str, cmd: list[str]) -> list[dict]:
    """The JSON records a run printed, or (trainfast train) wrote to its run folder's metrics.jsonl."""
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    if "--out" in cmd:
        metrics = Path(cmd[cmd.index("--out") + 1]) / "metrics.jsonl"
        if metrics.is_file():
            lines += metrics.read_text().splitlines()
    return [json.loads(line) for line in lines]


def photo_folder(root: Path, images: int) -> Path:
    """train/ and val/ of real photos (benchmarks/make_photo_folder.py), made once and reused."""
    sys.path.insert(0, str(HERE))
    from make_photo_folder import make_photo_folder

    data = root / f"photos-{images}"
    if not (data / "val").is_dir():
        make_photo_folder(data / "train", images=images, classes=4, seed=0)
        make_photo_folder(data / "val", images=max(8, images // 10), classes=4, seed=1)
    return data


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated: {', '.join(WORKLOADS)}")
    p.add_argument("--tools", default="plain,lightning,trainfast", help=f"comma-separated: {', '.join(TOOLS)}")
    p.add_argument("--tuned-recipe", type=Path, default=None, help="recipe file for the `tuned` column")
    p.add_argument("--timm-train", type=Path, default=None,
                   help="timm's train.py (from a pytorch-image-models checkout of the installed timm's era), "
                        "for the timm columns")
    p.add_argument("--images", type=int, default=None,
                   help="training photos (default: the workload's, 320 for ViT and 1,596 for ResNet-18; val: a tenth)")
    p.add_argument("--epochs", default="1,3",
                   help="short,long epoch counts (default 1,3); one count N: one run per tool and round, its whole "
                        "process and its epochs after the first (the quick mode: half the runs, no per-epoch "
                        "difference)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--precision", choices=("auto", "bf16", "fp16", "fp32"), default="auto",
                   help="the precision every tool runs in (default auto: bf16 where it is fast here, else fp32)")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "peers")
    p.add_argument("--device", default="cpu", help="where every tool trains: cpu (default) or cuda")
    p.add_argument("--workers", type=int, default=2, help="loader worker processes, every tool (default 2)")
    p.add_argument("--jpeg-folder", type=Path, default=None,
                   help="train on this folder of generated JPEGs (made there by make_jpeg_folder.py when it does "
                        "not exist) instead of the photo folder: the GPU workload")
    args = p.parse_args()

    workloads = args.workloads.split(",")
    tools = args.tools.split(",") + (["tuned"] if args.tuned_recipe and "tuned" not in args.tools else [])
    bad = [w for w in workloads if w not in WORKLOADS] + [t for t in tools if t not in TOOLS]
    if bad:
        raise SystemExit(f"unknown workload/tool: {', '.join(bad)}")
    if "tuned" in tools and (args.tuned_recipe is None or not args.tuned_recipe.is_file()):
        raise SystemExit(f"--tuned-recipe {args.tuned_recipe}: not a file (the `tuned` column needs one)")
    if any(t.startswith("timm") for t in tools) and (args.timm_train is None or not args.timm_train.is_file()):
        raise SystemExit(f"--timm-train {args.timm_train}: not a file (the timm columns run timm's own train.py)")
    short, long = parse_epochs(args.epochs)
    if any(t.startswith("lightning") for t in tools):
        ensure_lightning()
    args.out.mkdir(parents=True, exist_ok=True)

    from trainfast.envcheck import cpu_name

    precision = resolve_precision(args.precision) if args.device == "cpu" or args.precision != "auto" else "bf16"
    machine = cpu_name()
    if args.device.startswith("cuda"):
        import torch

        machine = f"{torch.cuda.get_device_name(torch.device(args.device))} with {machine}"
    results: dict = {"machine": machine, "cpus": os.cpu_count(), "precision": precision, "device": args.device,
                     "epochs": [short, long], "workloads": {}}
    for workload in workloads:
        images = args.images or WORKLOADS[workload][3]
        data = jpeg_folder(args.jpeg_folder, images) if args.jpeg_folder else photo_folder(args.out, images)
        per_epoch: dict[str, list[float]] = {t: [] for t in tools}
        last_epoch: dict[str, list[float]] = {t: [] for t in tools}
        accuracy: dict[str, list[float]] = {t: [] for t in tools}
        if "tuned" in tools and builds_cache(args.tuned_recipe):
            # Once, untimed: a recipe with the decode cache builds it on its first run over a folder (paid once
            # per folder and machine, not per run), which would otherwise land in round 1's short run only.
            warm = args.out / "runs" / f"{workload}-tuned-warm"
            shutil.rmtree(warm, ignore_errors=True)
            warm.mkdir(parents=True)
            run_once(command("tuned", workload, data, 1, warm / "out", args.tuned_recipe, precision,
                             device=args.device, workers=args.workers), "tuned",
                     warm / "log.txt")
        cpu_per_epoch: dict[str, list[float]] = {t: [] for t in tools}
        in_run: dict[str, list[float]] = {t: [] for t in tools}
        whole: dict[str, list[float]] = {t: [] for t in tools}      # the long run's wall, start-up included
        for r in range(args.repeats):
            order = round_order(tools, r)
            walls: dict[str, dict[int, float]] = {t: {} for t in tools}
            cpus: dict[str, dict[int, float]] = {t: {} for t in tools}
            # A tool's two runs back to back (short first in even rounds, long first in odd ones): its difference
            # then spans about a minute of the machine, not the whole round's drift.
            for tool in order:
                for epochs in run_lengths(short, long, r):
                    run_dir = args.out / "runs" / f"{workload}-{tool}-e{epochs}-r{r}"
                    shutil.rmtree(run_dir, ignore_errors=True)
                    run_dir.mkdir(parents=True)
                    cmd = command(tool, workload, data, epochs, run_dir / "out", args.tuned_recipe, precision,
                                  args.timm_train, args.device, args.workers)
                    seconds, acc, epoch_s, cpus[tool][epochs], marks = run_once(cmd, tool, run_dir / "log.txt")
                    walls[tool][epochs] = seconds
                    print(f"{workload} {tool:9s} r{r} {epochs} epoch(s): {seconds:6.1f} s in all, epochs "
                          + ", ".join(f"{e:.1f}" for e in epoch_s) + " s, epoch ends at "
                          + ", ".join(f"{m:.1f}" for m in marks) + " s", flush=True)
                    if epochs == long:
                        whole[tool].append(seconds)
                        if acc is not None:
                            accuracy[tool].append(acc)
                        if epoch_s:
                            last_epoch[tool].append(epoch_s[-1])
                        if len(marks) != long:
                            raise SystemExit(f"{tool}: {len(marks)} epoch ends found in {run_dir / 'log.txt'}, "
                                             f"expected {long}")
                        in_run[tool].append(in_run_epoch(marks))
            for tool in order if short else ():
                per_epoch[tool].append((walls[tool][long] - walls[tool][short]) / (long - short))
                cpu_per_epoch[tool].append((cpus[tool][long] - cpus[tool][short]) / (long - short))
                print(f"{workload} {tool:9s} r{r}: {walls[tool][short]:6.1f} s / {walls[tool][long]:6.1f} s -> "
                      f"{per_epoch[tool][-1]:6.2f} s per epoch, {cpu_per_epoch[tool][-1]:6.2f} CPU s "
                      f"({busy_fraction(cpu_per_epoch[tool][-1], per_epoch[tool][-1]):.0%} busy)", flush=True)
        trained = images_per_epoch(workload, args.images or WORKLOADS[workload][3])
        if not short:            # one run per tool: its epochs inside the run are its per-epoch cost
            per_epoch = {t: [s for s in v if s] for t, v in in_run.items()}
        medians = {t: statistics.median(v) for t, v in per_epoch.items()}
        rate = {t: [trained / s for s in v] for t, v in per_epoch.items()}
        median_rate = {t: statistics.median(v) for t, v in rate.items()}
        fastest_peer = max((median_rate[t] for t in median_rate if not t.startswith(("trainfast", "tuned"))),
                           default=None)
        results["workloads"][workload] = {
            "model": WORKLOADS[workload], "data": str(data), "per_epoch_s": per_epoch, "median_per_epoch_s": medians,
            "images_per_epoch": trained,
            "images_per_s": rate, "median_images_per_s": median_rate,
            "last_epoch_s": last_epoch,
            "per_epoch_from": "the long run's epochs after its first" if not short else "long run - short run",
            "whole_process_s": whole, "median_whole_process_s": {t: statistics.median(v) for t, v in whole.items()},
            "cpu_per_epoch_s": cpu_per_epoch,
            "median_cpu_per_epoch_s": {t: statistics.median(v) for t, v in cpu_per_epoch.items() if v},
            "median_busy": {t: busy_fraction(statistics.median(cpu_per_epoch[t]), medians[t]) for t in tools
                            if cpu_per_epoch[t]},
            "median_last_epoch_s": {t: statistics.median(v) for t, v in last_epoch.items() if v},
            # the same cost inside the long run: its epoch ends, first to last (in_run_epoch)
            "in_run_per_epoch_s": in_run,
            "median_in_run_per_epoch_s": {t: statistics.median(v) for t, v in in_run.items()},
            "in_run_same_switches": same_switch_verdicts(in_run, trained),
            "recipe_against": recipe_against(in_run, whole, trained),
            "val_accuracy": accuracy,
            "vs_fastest_peer": {t: m / fastest_peer for t, m in median_rate.items()} if fastest_peer else {},
            "same_switches": same_switch_verdicts(per_epoch, trained)}
    (args.out / "peers.json").write_text(json.dumps(results, indent=2))
    print_table(results, tools)


def parse_epochs(text: str) -> tuple[int | None, int]:
    """--epochs: "short,long" (0 < short < long), or one count: (None, N), one run per tool and round."""
    try:
        counts = [int(e) for e in text.split(",")]
    except ValueError:
        counts = []
    if len(counts) == 1 and counts[0] >= 2:
        return None, counts[0]
    if len(counts) == 2 and 0 < counts[0] < counts[1]:
        return counts[0], counts[1]
    raise SystemExit(f"--epochs {text}: need short,long with 0 < short < long, or one count of 2 or more")


def run_lengths(short: int | None, long: int, r: int) -> tuple[int, ...]:
    """The epoch counts a tool runs in round r, back to back: short first in even rounds, long first in odd."""
    if short is None:
        return (long,)
    return (short, long) if r % 2 == 0 else (long, short)


def builds_cache(recipe: Path | None) -> bool:
    """Whether a recipe file turns the decode cache on (its first run over a folder builds it: run once untimed)."""
    if recipe is None:
        return False
    from trainfast.recipe import read_recipe_file

    return bool(read_recipe_file(recipe).get("decode_cache"))


def recipe_against(in_run: dict[str, list[float]], whole: dict[str, list[float]], images: int) -> list[dict]:
    """The tuned recipe (trainfast's best) against every peer in the run, whatever switches each runs (what a user
    would otherwise run, at its best flags): per round, the ratio of their steady epochs inside the long run and of
    their whole processes (start-up and compile included); with 3 or more rounds, the verdict on the steady epochs
    by the ablation's statistics. With fewer rounds the ratios are given as they are, said to carry no interval."""
    from trainfast.stats import Repeat, compare, pooled_noise

    if "tuned" not in in_run:
        return []
    out = []
    for peer in (t for t in in_run if not t.startswith(("trainfast", "tuned"))):
        steady = [b / a for a, b in zip(in_run["tuned"], in_run[peer]) if a and b]
        procs = [b / a for a, b in zip(whole["tuned"], whole[peer])]
        entry = {"tool": "tuned", "peer": peer, "steady_epoch_speedup": steady, "whole_process_speedup": procs}
        if len(steady) >= 3:
            repeats = {t: [Repeat(((images, s),)) for s in in_run[t] if s] for t in ("tuned", peer)}
            c = compare("tuned", repeats["tuned"], peer, repeats[peer],
                        noise=pooled_noise([[Repeat(((images, s),)) for s in v if s] for v in in_run.values()]))
            entry["text"] = c.text
        else:
            entry["text"] = f"{len(steady)} round(s): ratios without an interval (3 or more rounds give one)"
        out.append(entry)
    return out


def round_order(tools: list[str], r: int) -> list[str]:
    """Round r's order: each trainfast tool runs next to the peers it is compared with (SAME_SWITCHES), so a
    pair's four runs span minutes of the machine, not the whole round's drift; the blocks rotate from one
    round to the next (no tool always first), and inside a block who goes first alternates."""
    blocks: list[list[str]] = []
    placed: set[str] = set()
    for tool in tools:
        if tool in placed:
            continue
        mine = tool if tool in SAME_SWITCHES else next((m for m, ps in SAME_SWITCHES.items() if tool in ps
                                                         and m in tools and m not in placed), None)
        block = [tool] if mine is None else [t for t in (*SAME_SWITCHES[mine], mine) if t in tools and t not in placed]
        blocks.append(block)
        placed.update(block)
    shift = r % len(blocks)
    blocks = blocks[shift:] + blocks[:shift]
    return [t for block in blocks for t in (block if r % 2 == 0 else reversed(block))]


def busy_fraction(cpu_s: float, wall_s: float, cores: int | None = None) -> float:
    """The share of the machine's cores an epoch kept busy: its CPU seconds over cores x wall seconds."""
    cores = cores or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    return cpu_s / max(1e-9, cores * wall_s)


# trainfast's tool -> the peer that runs the same switches: timm's train.py has its prefetcher on by default
# (trainfast --prefetch); Lightning and the plain loop normalize in the workers, as trainfast does without it.
SAME_SWITCHES = {"trainfast-pf": ("timm",), "trainfast-pf-cl": ("timm-cl",), "trainfast": ("lightning", "plain"),
                 "trainfast-cl": ("lightning-cl",)}


def same_switch_verdicts(per_epoch: dict[str, list[float]], images: int) -> list[dict]:
    """Each trainfast tool against each peer run with the same switches: the speed-up per round (paired: the
    two ran in the same round), its geometric mean with a 95% interval and the verdict, by the ablation's own
    statistics (trainfast.stats): the round-to-round noise pooled over every tool of the run (a tool + round
    model on log rates), a difference called only past the 5% minimum effect and a margin a rerun repeats, and
    the chance a rerun gives the same verdict. With the noise of a shared VM a few-percent difference is "no
    measurable difference": the table says so instead of ranking noise."""
    from trainfast.stats import Repeat, compare, pooled_noise

    repeats = {t: [Repeat(((images, s),)) for s in v] for t, v in per_epoch.items()}
    noise = pooled_noise(list(repeats.values()))
    out = []
    for mine, peers in SAME_SWITCHES.items():
        for peer in peers:
            if mine not in repeats or peer not in repeats:
                continue
            c = compare(mine, repeats[mine], peer, repeats[peer], noise=noise)
            out.append({"tool": mine, "peer": peer, **c.to_dict(), "text": c.text,
                        "per_round": [a.rate / b.rate for a, b in zip(repeats[mine], repeats[peer])],
                        "noise_per_run": math.sqrt(noise.variance) if noise else None})
    return out


def print_table(results: dict, tools: list[str]) -> None:
    first = next(iter(results["workloads"].values()))
    print(f"\nimages per second over the per-epoch cost ({first.get('per_epoch_from', 'long run - short run')}; "
          f"median of {len(first['per_epoch_s'][tools[0]])} repeats; x = this tool's rate / the fastest peer's), "
          f"{results['precision']}, {results['cpus']} CPUs, {results['machine']}")
    print("| workload | " + " | ".join(tools) + " |")
    print("|---|" + "---|" * len(tools))
    for name, w in results["workloads"].items():
        cells = [f"{w['median_images_per_s'][t]:.1f} img/s, {w['median_per_epoch_s'][t]:.1f} s "
                 f"({w['vs_fastest_peer'].get(t, float('nan')):.2f}x)" for t in tools]
        print(f"| {name} | " + " | ".join(cells) + " |")
        rounds = len(w["images_per_s"][tools[0]])
        for r in range(rounds):
            print(f"| {name}, round {r + 1} | " + " | ".join(f"{w['images_per_s'][t][r]:.1f}" for t in tools) + " |")
        last = w.get("median_last_epoch_s", {})
        if last:
            cells = [f"{last[t]:.1f} s" if t in last else "—" for t in tools]
            print(f"| {name}, the long run's last epoch timed inside the process | " + " | ".join(cells) + " |")
        procs = w.get("median_whole_process_s", {})
        if procs:
            cells = [f"{procs[t]:.1f} s" for t in tools]
            print(f"| {name}, the long run's whole process (start-up, compile, every epoch) | "
                  + " | ".join(cells) + " |")
        cpu, busy = w.get("median_cpu_per_epoch_s", {}), w.get("median_busy", {})
        if cpu and len(cpu) == len(tools):
            cells = [f"{cpu[t]:.1f} CPU s ({busy[t]:.0%} busy)" for t in tools]
            print(f"| {name}, CPU an epoch (tool + workers) | " + " | ".join(cells) + " |")
        inside = w.get("median_in_run_per_epoch_s", {})
        if inside:
            cells = [f"{w['images_per_epoch'] / inside[t]:.1f} img/s, {inside[t]:.1f} s" for t in tools]
            print(f"| {name}, inside the long run (first epoch end to last) | " + " | ".join(cells) + " |")
        for label, key in (("whole process", "same_switches"), ("inside the long run", "in_run_same_switches")):
            for pair in w.get(key, []):
                rounds = ", ".join(f"{r:.2f}x" for r in pair["per_round"])
                agree = f"; a rerun agrees {pair['agreement']:.0%}" if pair.get("agreement") is not None else ""
                print(f"  same switches ({label}): {pair['tool']} vs {pair['peer']}: rounds {rounds}; "
                      f"{pair['text']}{agree}")
        for pair in w.get("recipe_against", []):
            steady = ", ".join(f"{r:.2f}x" for r in pair["steady_epoch_speedup"])
            procs = ", ".join(f"{r:.2f}x" for r in pair["whole_process_speedup"])
            print(f"  trainfast's recipe vs {pair['peer']}: steady epochs {steady}; whole process {procs}; "
                  f"{pair['text']}")


if __name__ == "__main__":
    main()
