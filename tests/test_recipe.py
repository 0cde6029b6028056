"""Every refused Recipe combination gives its own message; bad config files and flags are refused before
any work starts."""
import subprocess
import sys

import pytest
import torch

from trainfast import recipe as recipe_mod
from trainfast.recipe import Recipe, RecipeError, preset, validate_for_device

REFUSED = [
    (dict(num_workers=-1), "num_workers=-1 must be a non-negative integer"),
    (dict(persistent_workers=True), "persistent_workers=True needs num_workers > 0"),
    (dict(prefetch_factor=2), "prefetch_factor needs num_workers > 0"),
    (dict(num_workers=2, prefetch_factor=0), "prefetch_factor=0 must be >= 1"),
    (dict(non_blocking=True), "non_blocking=True needs pin_memory=True"),
    (dict(precision="fp8"), "precision='fp8' is not one of fp32, bf16, fp16"),
    (dict(optimizer_impl="turbo"), "optimizer_impl='turbo' is not one of"),
    (dict(batch_size=0), "batch_size=0 must be a positive integer"),
    (dict(epochs=1.5), "epochs=1.5 must be a positive integer"),
    (dict(lr=0.0), "lr=0.0 must be positive"),
    (dict(grad_clip=-1.0), "grad_clip=-1.0 must be positive"),
    (dict(nonfinite="ignore"), "nonfinite='ignore' is not one of"),
]


@pytest.mark.parametrize("changes,message", REFUSED, ids=[m.split()[0] for _, m in REFUSED])
def test_refused_combination_names_the_field(changes, message):
    with pytest.raises(RecipeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Recipe(**changes)


def test_fp16_refused_on_a_device_that_cannot(monkeypatch):
    monkeypatch.setattr(recipe_mod, "_cpu_supports_fp16_autocast", lambda: False)
    with pytest.raises(RecipeError, match="precision=fp16 is not supported by autocast on this CPU"):
        validate_for_device(Recipe(precision="fp16"), torch.device("cpu"))


def test_bf16_refused_on_a_gpu_without_bf16(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    with pytest.raises(RecipeError, match="precision=bf16 is not supported on cuda"):
        validate_for_device(Recipe(precision="bf16"), torch.device("cuda"))


def test_valid_recipes_pass():
    Recipe(num_workers=2, persistent_workers=True, prefetch_factor=4, non_blocking=True, pin_memory=True)
    Recipe(prefetch=True, non_blocking=True)   # the prefetcher pins and copies asynchronously itself
    validate_for_device(preset("fast"), torch.device("cpu"))


def test_unknown_config_key_is_refused(tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text("precision: bf16\nset_to_nnone: true\n")
    with pytest.raises(RecipeError, match=r"recipe.yaml: unknown key\(s\) set_to_nnone"):
        Recipe.from_file(path)


def test_config_file_values_are_validated(tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text("num_workers: -3\n")
    with pytest.raises(RecipeError, match="num_workers=-3"):
        Recipe.from_file(path)


def test_yaml_numbers_in_exponent_form_are_numbers_and_types_are_checked(tmp_path):
    """YAML 1.1 (PyYAML) reads `1e-3` as a string; a recipe reads it as the number everyone means. A string
    where a switch wants true/false is refused: "false" is truthy and would switch the technique on."""
    path = tmp_path / "recipe.yaml"
    path.write_text("lr: 1e-3\nweight_decay: 5E-2\ngrad_clip: 1e0\n")
    assert Recipe.from_file(path) == Recipe(lr=0.001, weight_decay=0.05, grad_clip=1.0)
    for text, message in (('compile: "false"\n', "compile='false' must be true or false"),
                          ("channels_last: 1\n", "channels_last=1 must be true or false"),
                          ("lr: fast\n", "lr='fast' must be a number"),
                          ("prefetch_factor: '2'\nnum_workers: 2\n", "prefetch_factor='2' must be an integer"),
                          ("lr: 0.1\nlr: 0.2\n", "key 'lr' is given twice")):
        path.write_text(text)
        with pytest.raises(RecipeError, match="recipe.yaml") as raised:
            Recipe.from_file(path)
        assert message in str(raised.value)


def test_yaml_python_object_tag_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.yaml"
    path.write_text(f"seed: !!python/object/apply:os.system ['touch {marker}']\n")
    with pytest.raises(RecipeError, match="not valid safe YAML"):
        Recipe.from_file(path)
    assert not marker.exists()


def test_config_file_round_trip(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("precision: bf16\nset_to_none: true\nnum_workers: 2\n")
    assert Recipe.from_file(path) == Recipe(precision="bf16", set_to_none=True, num_workers=2)


def run_cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "trainfast", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def run_cli_here(*args, cwd, capsys, monkeypatch) -> tuple[int, str]:
    """The CLI's main() in this process (an interpreter's start saved per case): its exit code and stderr. The
    real entry point, `python -m trainfast`, is run by test_bad_config_key_via_cli."""
    from trainfast.cli import main

    monkeypatch.chdir(cwd)
    try:
        code = main(list(args))
    except SystemExit as exc:           # argparse's refusals
        code = exc.code
    return code, capsys.readouterr().err


@pytest.mark.parametrize("args,message", [
    (["ablate", "--set-to-nnone"], "unrecognized arguments: --set-to-nnone"),
    (["train", "--num-workers", "two"], "argument --num-workers: invalid int value: 'two'"),
    (["ablate", "--persistent-workers"], "persistent_workers=True needs num_workers > 0"),
    (["ablate", "--rungs", "baseline,warp"], "unknown rung(s) warp"),
    (["ablate", "--data", "mnist"], "unknown dataset 'mnist'"),
    (["ablate", "--data", "imagefolder:/nonexistent/x"], "folder does not exist"),
    (["train", "--model", "resnet5O"], "'resnet5O' is neither a built-in model"),
    (["train", "--recipe", "warp"], "--recipe 'warp' is not a preset"),
])
def test_bad_cli_input_is_refused_before_any_work(tmp_path, args, message, capsys, monkeypatch):
    code, err = run_cli_here(*args, "--out", str(tmp_path / "out"), cwd=tmp_path, capsys=capsys,
                             monkeypatch=monkeypatch)
    assert code == 2, err
    assert message in err
    assert not (tmp_path / "out").exists() and not (tmp_path / "runs").exists(), "work started before the refusal"


def test_bad_config_key_via_cli(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("bogus_field: 1\n")
    proc = run_cli("train", "--recipe", str(cfg), "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert proc.returncode == 2 and "unknown key(s) bogus_field" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_every_recipe_field_is_documented_in_the_cli_help(capsys):
    import dataclasses

    from trainfast.cli import build_parser
    from trainfast.recipe import field_docs

    docs = field_docs()
    assert set(docs) == {f.name for f in dataclasses.fields(Recipe)}      # a new field needs its comment
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "image folders: decode every file once to a uint8 cache on disk (default: False)" in out
    assert "micro-batches per optimizer step" in out


@pytest.mark.parametrize("name,message", [("mps", "mps is not available"), ("xpu", "xpu is not available"),
                                          ("meta", "meta tensors hold no data"), ("tpu", "is not a torch device")])
def test_a_device_this_machine_lacks_is_refused_naming_the_flag(name, message):
    from trainfast.recipe import resolve_device

    if name == "mps" and torch.backends.mps.is_available() or name == "xpu" and torch.xpu.is_available():
        pytest.skip(f"this machine has {name}")
    with pytest.raises(RecipeError, match=f"--device '{name}'") as raised:
        resolve_device(name)
    assert message in str(raised.value)


def test_every_field_sits_in_a_section_and_the_help_groups_by_them(capsys):
    """The Recipe is read in sections (the class's `# --- section ---` lines): every field is in exactly one, and
    `--help` shows one group per section with its fields under it."""
    import dataclasses

    from trainfast.cli import main
    from trainfast.recipe import field_sections

    sections = field_sections()
    named = [name for names in sections.values() for name in names]
    assert sorted(named) == sorted(f.name for f in dataclasses.fields(Recipe)) and len(named) == len(set(named))
    assert {"what is trained", "the input pipeline", "memory", "reliability"} <= set(sections)
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = capsys.readouterr().out
    for title, names in sections.items():
        block = text[text.index(f"recipe: {title}"):]
        following = [t for t in sections if t != title and f"recipe: {t}" in block]
        end = min((block.index(f"recipe: {t}") for t in following), default=len(block))
        for name in names:
            assert "--" + name.replace("_", "-").removesuffix("-s") in block[:end], (title, name)
