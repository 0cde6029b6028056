"""Reading a framework run's proof (ablation/proof.py) and the switchboard that writes it (frameworks/board.py),
and the post-import hook that installs an adapter (frameworks/hooks.py)."""
from __future__ import annotations

import subprocess
import sys

from trainfast.ablation.proof import not_applied, script_settings, unsupported
from trainfast.frameworks.board import Board, UNSET


def section(**switches) -> dict:
    board = Board({"precision": "bf16", "compile": True})
    record = board.framework("transformers", "5.0")
    for setting, (field, wanted, script, read) in switches.items():
        record.set(field, setting, wanted, script)
        if read is not UNSET:
            record.prove(setting, read)
    record.unsupported["channels_last"] = "the model has no convolutions"
    return board.to_dict()


def test_a_switch_read_back_as_asked_is_applied_and_one_read_back_otherwise_is_not():
    proof = section(bf16=("precision", True, False, True), torch_compile=("compile", True, False, False))
    assert not_applied({"precision": "bf16"}, proof) is None
    problem = not_applied({"compile": True}, proof)
    assert "torch_compile" in problem and "read back False" in problem


def test_a_switch_never_read_back_is_not_applied():
    proof = section(bf16=("precision", True, False, UNSET))
    assert "nothing read back" in not_applied({"precision": "bf16"}, proof)


def test_a_field_no_adapter_met_is_not_applied():
    proof = section(bf16=("precision", True, False, True))
    assert "no adapter met" in not_applied({"optimizer_impl": "fused"}, proof)


def test_unsupported_only_when_no_switch_serves_any_field_of_the_rung():
    proof = section(bf16=("precision", True, False, True))
    assert "no convolutions" in unsupported({"channels_last": True}, proof)
    assert unsupported({"channels_last": True, "precision": "bf16"}, proof) is None
    assert unsupported({"optimizer_impl": "fused"}, proof) is None       # unknown: left to the read-back


def test_script_settings_lists_only_what_the_script_had_and_the_run_replaced():
    board = Board({"precision": "fp32"})
    record = board.framework("transformers", "5.0")
    record.set("precision", "bf16", False, True)
    record.set("precision", "fp16", False, False)
    record.set("compile", "torch_compile", False)            # UNSET: the framework's default
    assert script_settings(board.to_dict()) == ["transformers bf16=True"]
    assert board.overridden() == {"transformers.bf16": [True, False]}


def test_the_first_value_met_is_the_scripts_even_when_set_again():
    board = Board({})
    record = board.framework("x", "1")
    record.set("precision", "bf16", True, False)
    record.set("precision", "bf16", True, True)               # set again by a later object: not the script's
    assert record.switches["bf16"].script is False


def test_a_failing_reader_leaves_the_switches_unproven_and_says_why():
    board = Board({})
    record = board.framework("x", "1")
    record.set("compile", "torch_compile", True)

    def broken(_):
        raise RuntimeError("no model")
    record.readers.append(broken)
    out = board.to_dict()["x"]
    assert out["switches"]["torch_compile"]["applied"] is None and "no model" in out["notes"][0]


def test_the_post_import_hook_runs_after_the_module_and_at_once_for_one_already_imported():
    code = (
        "import sys\n"
        "from trainfast.frameworks.hooks import when_imported\n"
        "seen = []\n"
        "when_imported('json.decoder', lambda m: seen.append(('late', hasattr(m, 'JSONDecoder'))))\n"
        "assert 'json.decoder' not in sys.modules and not seen\n"
        "import json\n"
        "when_imported('json', lambda m: seen.append(('now', m.__name__)))\n"
        "print(seen)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[('late', True), ('now', 'json')]"
