"""A command line that cannot work is refused before torch is imported: argparse's refusals (an unknown flag, a
bad type or choice, a Recipe field out of its range) and the checks that need no torch (a --data folder that does
not exist, a --recipe file that is missing, a model name the task does not have, and what a task's declaration
refuses: a switch on data it does not offer, a strategy or flag it has no use for, a contradiction in its own
default recipe). Each runs in a fresh process whose import of torch is blocked and recorded, so a refusal that
reached torch fails here whatever it printed."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainfast.cliflags import parse_command_line

SRC = Path(__file__).resolve().parents[1] / "src"

# Blocks `import torch` (and its submodules) in the child, says so at exit, and runs the CLI as `trainfast` does.
# A blocked import that the CLI caught and hid is still reported: the finder records every attempt.
CHILD = """
import atexit, sys

attempts = []

class BlockTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            attempts.append(name)
            raise ImportError(f"torch is blocked in this test ({name})")
        return None

sys.meta_path.insert(0, BlockTorch())
atexit.register(lambda: print(f"TORCH IMPORT ATTEMPTED: {attempts}" if attempts else "torch never imported",
                              file=sys.stderr))
sys.argv[0] = "trainfast"
from trainfast.cli import main
sys.exit(main(sys.argv[1:]))
"""


def run_cli(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-c", CHILD, *argv], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)


# What a task refuses, read from its declaration (tasks/declarations.py) before torch loads
TASK_REFUSALS = [
    (["ablate", "--task", "lm", "--channels-last"],
     "trainfast ablate: error: channels_last=True: channels_last acts on image batches (NCHW tensors a conv net "
     "reads); the lm task's batches are token ids of documents of different lengths"),
    (["train", "--task", "lm", "--persistent-workers"],      # on the language model's own default recipe
     "trainfast train: error: persistent_workers=True needs num_workers > 0"),
    (["ablate", "--task", "detection", "--padding-free"],
     "trainfast ablate: error: padding_free=True: padding_free acts on a language model's documents"),
    (["train", "--model", "llama-tiny", "--decode-cache"],    # the task inferred from the model's name
     "trainfast train: error: decode_cache=True: decode_cache acts on image-folder files"),
    (["tune", "--task", "lm", "--prefetch"],
     "trainfast tune: error: prefetch=True: prefetch acts on batches stacked at one shape"),
    (["train", "--task", "detection", "--strategy", "dp"],
     "trainfast train: error: strategy=dp computes a classification loss inside each replica; for detection"),
    (["train", "--task", "lm", "--strategy", "dp"],
     "trainfast train: error: strategy=dp computes a classification loss inside each replica; for a language"),
    (["ablate", "--task", "detection", "--precision", "bf16", "--precision-level", "master"],
     "trainfast ablate: error: precision_level='master' casts the whole detector to bf16"),
    (["train", "--task", "lm", "--image-size", "32"],
     "trainfast train: error: --image-size 32: the language-model task reads documents, not images"),
    (["ablate", "--task", "detection", "--image-size", "100"],
     "trainfast ablate: error: --image-size 100: detection models resize their images themselves"),
    (["tune", "--task", "detection"],
     "trainfast tune: error: trainfast tune runs the built-in classification run only; measure --task detection"),
    (["doctor", "--model", "fasterrcnn_mobilenet_v3_large_fpn"],
     "trainfast doctor: error: trainfast doctor runs the built-in classification run only"),
    # a --data no loader of the task reads (dataspecs.py, the parser the loaders use)
    (["ablate", "--data", "mnist"], "trainfast ablate: error: --data 'mnist': unknown dataset 'mnist'; choose digits"),
    (["train", "--task", "lm", "--data", "books"], "trainfast train: error: --data 'books': the language-model task "
                                                    "reads `stdlib`"),
]


@pytest.mark.parametrize("argv, message", [
    (["ablate", "--bogus"], "trainfast ablate: error: unrecognized arguments: --bogus"),
    (["tune", "--bogus"], "trainfast tune: error: unrecognized arguments: --bogus"),
    (["doctor", "--frobnicate", "3"], "trainfast doctor: error: unrecognized arguments: --frobnicate 3"),
    (["ablate", "--data", "imagefolder:/nonexistent"],
     "trainfast ablate: error: --data imagefolder:/nonexistent: folder does not exist"),
    (["train", "--task", "detection", "--data", "coco:/nonexistent"],
     "trainfast train: error: --data coco:/nonexistent: folder does not exist"),
    (["bench-data", "--data", "imagefolder:/nonexistent"],
     "trainfast bench-data: error: --data imagefolder:/nonexistent: folder does not exist"),
    (["train", "--batch-size", "0"],
     "trainfast train: error: argument --batch-size: must be a positive integer, got 0"),
    (["ablate", "--epochs", "-1"], "trainfast ablate: error: argument --epochs: must be a positive integer, got -1"),
    (["train", "--lr", "0"], "trainfast train: error: argument --lr: must be positive, got 0"),
    (["train", "--precision", "fp64"], "trainfast train: error: argument --precision: invalid choice: 'fp64'"),
    (["train", "--num-workers", "two"], "trainfast train: error: argument --num-workers: invalid int value: 'two'"),
    (["train", "--num-workers", "-1"],
     "trainfast train: error: argument --num-workers: must be a non-negative integer or 'auto', got -1"),
    (["ablate", "--image-size", "0"], "trainfast ablate: error: argument --image-size: must be a positive integer"),
    (["tune", "--budget", "soon"], "trainfast tune: error: argument --budget: must be a duration"),
    (["train", "--recipe", "missing.yaml"], "trainfast train: error: config file missing.yaml does not exist"),
    (["ablate", "--recipe", "nosuchpreset"], "trainfast ablate: error: --recipe 'nosuchpreset' is not a preset"),
    (["train", "--persistent-workers"], "trainfast train: error: persistent_workers=True needs num_workers > 0"),
    (["train", "--task", "detection", "--model", "resnet50"],
     "trainfast train: error: --model 'resnet50' is not a supported detection model"),
    (["ablate", "--target", "val_loss<3"], "trainfast ablate: error: argument --target: --target 'val_loss<3' is not"),
    (["train", "--target", "auto"], "trainfast train: error: --target auto is the level a baseline's runs reach"),
    (["ablate", "--task", "lm", "--model", "llama-tinyy"],
     "trainfast ablate: error: --model 'llama-tinyy' is not a language model trainfast defines"),
    (["ablate", "--resume"], "trainfast ablate: error: --resume needs --out DIR"),
    (["tune", "--resume", "A", "--out", "B"], "trainfast tune: error: --resume A and --out B name different folders"),
    (["tune", "--nproc", "2"], "trainfast tune: error: --nproc runs a `-- COMMAND` under torchrun"),
    (["doctor", "--"], "trainfast doctor: error: doctor -- COMMAND: no command after `--`"),
    # a script's own flags as rungs (scriptargs.py): each refusal names the --rung
    (["ablate", "--rung", "bad name=--amp", "--", "python", "t.py"],
     "trainfast ablate: error: --rung 'bad name=--amp': the rung name 'bad name' must start with a letter"),
    (["ablate", "--rung", "own=", "--", "python", "t.py"],
     "trainfast ablate: error: --rung 'own=': the rung changes nothing"),
    (["ablate", "--rung", "amp=--amp", "--rung", "own_amp=--bf16", "--", "python", "t.py"],
     "trainfast ablate: error: --rung own_amp: two rungs have this name"),
    (["tune", "--rung", "tf32=MY-VAR=1 --x", "--", "python", "t.py"],
     "trainfast tune: error: --rung 'tf32=MY-VAR=1 --x': 'MY-VAR' is not an environment variable name"),
    (["ablate", "--rung", "own=--amp", "--rung", "own=--compile", "--", "python", "t.py"],
     "trainfast ablate: error: --rung own: two rungs have this name"),
    (["ablate", "--rung", "own=--amp"], "trainfast ablate: error: --rung own=--amp: a rung of a script's own flags "
                                        "needs the script after `--`"),
    (["ablate", "--ladder", "missing.yaml", "--", "python", "t.py"],
     "trainfast ablate: error: --ladder missing.yaml: No such file or directory"),
    (["ablate", "--switches", "amp,chanels_last"],
     "trainfast ablate: error: --switches: unknown rung(s) chanels_last (did you mean channels_last?); choose from"),
    (["tune", "--task", "lm", "--switches", "paddingfree", "--", "python", "train.py"],
     "trainfast tune: error: --switches: unknown rung(s) paddingfree (did you mean padding_free?)"),
    (["doctor", "--nproc", "2"], "trainfast doctor: error: doctor --nproc runs a `-- COMMAND` under torchrun"),
    *TASK_REFUSALS,
])
def test_a_command_line_that_cannot_work_is_refused_before_torch_loads(argv, message, tmp_path):
    done = run_cli(argv, tmp_path)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert "torch never imported" in done.stderr, done.stderr


def test_an_unreadable_recipe_file_is_refused_before_torch_loads(tmp_path):
    (tmp_path / "bad.yaml").write_text("batch_size: [unclosed\n")
    (tmp_path / "zero.yaml").write_text("batch_size: 0\n")
    done = run_cli(["train", "--recipe", "bad.yaml"], tmp_path)
    assert done.returncode == 2 and "config file bad.yaml: not valid safe YAML" in done.stderr
    done = run_cli(["train", "--recipe", "zero.yaml"], tmp_path)
    assert done.returncode == 2 and "config file zero.yaml: batch_size=0 must be a positive integer" in done.stderr
    assert "torch never imported" in done.stderr
    (tmp_path / "grouped.yaml").write_text("group_aspect_ratio: true\n")     # a recipe file's switch, not a flag's
    done = run_cli(["train", "--task", "lm", "--recipe", "grouped.yaml"], tmp_path)
    assert done.returncode == 2
    assert "group_aspect_ratio=True: group_aspect_ratio acts on detection images" in done.stderr
    assert "torch never imported" in done.stderr


@pytest.mark.parametrize("argv, message", TASK_REFUSALS)
def test_a_task_refuses_with_the_words_of_its_later_check(argv, message):
    """Each early refusal of a task's is the one the run would give after torch has loaded (cli.prepare_task, then
    the task's data), word for word: check_before_torch reads the same declarations."""
    from trainfast.cli import prepare_task
    from trainfast.tasks import build_task

    args = parse_command_line(argv)
    with pytest.raises(ValueError) as refused:
        prepare_task(args)
        build_task(args.task).load_data(args.data, args.image_size)
    assert message in f"trainfast {args.command}: error: {refused.value}"


def test_the_blocker_sees_torch_when_it_is_imported(tmp_path):
    """The check above can fail: a command line that gets as far as the work imports torch, and the child says so."""
    done = run_cli(["train", "--model", "no_such_timm_model", "--epochs", "1"], tmp_path)
    assert "TORCH IMPORT ATTEMPTED" in done.stderr


def test_the_light_name_lists_match_what_builds_the_models():
    pytest.importorskip("torchvision")
    from trainfast.detection.models import CPU_DEFAULTS
    from trainfast.modelnames import DETECTION_MODELS

    assert tuple(CPU_DEFAULTS) == DETECTION_MODELS


def test_a_name_the_task_has_and_a_folder_that_exists_pass_the_early_checks(tmp_path):
    from trainfast.cliflags import check_before_torch

    for argv in (["train", "--data", f"imagefolder:{tmp_path}"], ["ablate", "--model", "llama-tiny"],
                 ["train", "--model", "resnet18"], ["ablate", "--task", "detection", "--data", "synthetic"],
                 ["doctor", "--task", "detection", "--", "python", "train.py"],       # a script's own run
                 ["ablate", "--task", "detection", "--epochs", "2"],       # on detection's own recipe
                 ["train", "--task", "lm", "--num-workers", "2", "--persistent-workers"]):
        check_before_torch(parse_command_line(argv))


def test_the_rung_names_read_before_torch_are_the_ladders_and_refused_with_the_same_words():
    """--switches' names as the command line reads them from the declarations' source (techniques/static.py) are
    every task's rung table, and a misspelt one is refused by the ladder with the words the early check said."""
    from trainfast.ablation.ladders import LADDERS, SCRIPT, plan_rungs
    from trainfast.recipe import Recipe, RecipeError
    from trainfast.techniques.static import RUNG_ALIASES, rung_names, unknown_rungs

    for task, (_, table) in LADDERS.items():
        assert sorted(rung_names(None if task == SCRIPT else task)) == sorted([*table, *RUNG_ALIASES]), task
    early = unknown_rungs(["master-bf61"], rung_names("classification"))
    assert "master-bf61 (did you mean master-bf16 or master-fp16?)" in early
    with pytest.raises(RecipeError, match="did you mean master-bf16") as late:
        plan_rungs(Recipe(), ["master-bf61"])
    assert str(late.value).split(";")[0] == early.split(";")[0]
