"""An AOTInductor package behind the artifact contract (``service.engine.exported_artifact``) without compiling one:
what ``check_runnable`` refuses before anything is loaded, the input shapes ``check_inputs`` keeps compiled code to,
and how ``CompiledDirector`` calls its methods (plain functions stand in for the compiled ones). Loading a real
package is tests/service/test_exported_artifact.py's."""

from __future__ import annotations

import platform
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from artifact.formats import Compiled
from service.engine.exported_artifact import (
    PATH,
    CannotRun,
    CompiledDirector,
    check_inputs,
    check_runnable,
    isa_level,
    load_compiled,
    major_minor,
)

CPU = torch.device("cpu")
THIS_TORCH = ".".join(major_minor(torch.__version__))


def compiled(**fields: Any) -> Compiled:
    return Compiled.model_validate({"device": "cpu", "methods": ["sample_rows"], **fields})


def test_versions_compare_by_major_and_minor_and_isas_by_level() -> None:
    assert major_minor("2.14.1+cu130") == major_minor("2.14") == ("2", "14")
    assert major_minor("2.4.0") != major_minor("2.14.0")
    isas = (None, "", "  ", "DEFAULT", "avx2", "AVX512 AVX512_VNNI", "NEON")
    assert [isa_level(isa) for isa in isas] == [0, 0, 0, 0, 1, 2, 0]


def test_a_package_this_server_runs_passes() -> None:
    check_runnable(compiled(torch=torch.__version__, machine=platform.machine(), cpu_isa="DEFAULT"), CPU)
    check_runnable(compiled(), CPU)  # nothing recorded but the device: nothing else to refuse


@pytest.mark.parametrize(("fields", "reason"), [
    ({"device": "cuda"}, "compiled for cuda; this server runs on cpu"),
    ({"torch": "1.13.1"}, "compiled by torch 1.13.1; this server runs torch " + re.escape(torch.__version__)),
    ({"machine": "riscv64"}, "compiled for riscv64; this server is " + re.escape(platform.machine())),
])
def test_a_package_compiled_for_something_else_is_refused_with_the_reason(fields: dict[str, Any], reason: str
                                                                          ) -> None:
    with pytest.raises(CannotRun, match=reason):
        check_runnable(compiled(**fields), CPU)


def test_a_package_needing_a_wider_instruction_set_than_the_cpu_offers_is_refused(monkeypatch: pytest.MonkeyPatch
                                                                                  ) -> None:
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")  # the host's CPU, as reported
    check_runnable(compiled(cpu_isa="AVX2"), CPU)
    with pytest.raises(CannotRun, match="needs the CPU instruction set AVX512 AVX512_VNNI; this CPU offers AVX2"):
        check_runnable(compiled(cpu_isa="AVX512 AVX512_VNNI"), CPU)


def test_load_compiled_checks_before_it_reads_the_file(tmp_path: Path) -> None:
    with pytest.raises(CannotRun, match="compiled for cuda"):
        load_compiled(tmp_path / "absent.pt2", compiled(device="cuda"), CPU)


def test_inputs_must_have_the_shapes_the_package_was_compiled_for() -> None:
    bounds = compiled(inputs=[[[1, 8], 3], [[1, None]]]).inputs  # pixels [1..8, 3], repeats [1..any]
    assert bounds == [[(1, 8), 3], [(1, None)]]
    check_inputs((torch.zeros(8, 3), torch.ones(100)), bounds)
    for inputs, reason in [((torch.zeros(2, 3),), "takes 2 inputs, got 1"),
                           ((torch.zeros(2, 3, 1), torch.ones(2)), "input 0 has 3 dimensions, the package takes 2"),
                           ((torch.zeros(9, 3), torch.ones(9)), r"input 0 dimension 0 is 9; the package takes 1\.\.8"),
                           ((torch.zeros(2, 4), torch.ones(2)), r"input 0 dimension 1 is 4; the package takes 3\.\.3"),
                           ((torch.zeros(2, 3), torch.ones(0)),
                            r"input 1 dimension 0 is 0; the package takes 1\.\.any")]:
        with pytest.raises(ValueError, match=reason):
            check_inputs(inputs, bounds)


def sample_rows(pixels: torch.Tensor, repeats: torch.Tensor) -> torch.Tensor:
    """Each input's rows are ``[i, -i]`` for input i, repeated; refuses a view, as compiled code would misread it."""
    assert pixels.is_contiguous()
    index = torch.arange(pixels.shape[0], dtype=torch.float32)
    return torch.stack([index, -index], 1).repeat_interleave(repeats, 0)  # [sum(repeats), 2]


def test_the_compiled_methods_answer_as_a_torchscript_module_would() -> None:
    with pytest.raises(CannotRun, match="has no sample_rows"):
        CompiledDirector({"scored_rows": sample_rows})
    director = CompiledDirector({"sample_rows": sample_rows})
    assert not hasattr(director, "scored_rows") and director.eval() is director
    view = torch.zeros(4, 3)[:, :2]  # not contiguous: passed as a copy
    assert director.sample_rows(view, torch.tensor([1, 2, 0, 1])).tolist() == [[0, 0], [1, -1], [1, -1], [3, -3]]
    logits = director(torch.zeros(3, 2), 2)  # forward: [S, B, C]
    assert logits.shape == (2, 3, 2) and logits[:, 2].tolist() == [[2, -2], [2, -2]]
    scored = CompiledDirector({"sample_rows": sample_rows, "scored_rows": lambda *inputs: "scored"})
    assert hasattr(scored, "scored_rows") and scored.scored_rows(torch.zeros(1, 2), torch.ones(1)) == "scored"


def test_bounds_are_checked_on_every_call() -> None:
    director = CompiledDirector({"sample_rows": sample_rows}, [[[1, 4], 2], [[1, 4]]])
    assert director.sample_rows(torch.zeros(4, 2), torch.ones(4, dtype=torch.long)).shape == (4, 2)
    with pytest.raises(ValueError, match="dimension 0 is 5"):
        director.sample_rows(torch.zeros(5, 2), torch.ones(5, dtype=torch.long))


def test_a_loader_message_names_no_path() -> None:
    message = "could not open /tmp/abc/model.so: no such file (C:/x/y.dll too)"
    assert PATH.sub("<path>", message) == "could not open <path> no such file (<path> too)"
