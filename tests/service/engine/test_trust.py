"""What the server agrees to load (``service.engine.trust``): folders that resolve outside the repository, and with
an allowlist, module files whose sha256 it does not list, are refused with a reason that names no absolute path. The
files are a few bytes: trust reads digests, it loads nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from artifact.contract import ARTIFACT, sha256_file
from artifact.formats import EXPORTED_ARTIFACT
from service.engine.trust import Untrusted, check, read_digests

A, B = "a" * 64, "b" * 64


def version(root: Path, name: str = "tiny", number: str = "1", content: bytes = b"module") -> Path:
    folder = root / name / number
    folder.mkdir(parents=True)
    (folder / ARTIFACT).write_bytes(content)
    return folder


def untrusted(root: Path, folder: Path, allowlist: Path | None) -> str:
    with pytest.raises(Untrusted) as error:
        check(root, folder, allowlist)
    return str(error.value)


def test_the_allowlist_is_the_first_word_of_each_line_as_sha256sum_writes_it(tmp_path: Path) -> None:
    allowlist = tmp_path / "digests"
    allowlist.write_text(f"# models we built\n\n{A}  repo/tiny/1/director.ts\n  {B.upper()}\n")
    assert read_digests(allowlist) == {A, B}  # case folded to what sha256_file gives


@pytest.mark.parametrize(("content", "reason"), [
    (f"{A}\n\nnot-a-digest {A}\n".encode(), "line 3: not a sha256 digest: 'not-a-digest'"),
    (f"{A[:63]}\n".encode(), "line 1: not a sha256 digest"),
    (b"\xff\xfe\n", "cannot read the trusted digests file"),
    (None, r"cannot read the trusted digests file \(No such file or directory\)"),
])
def test_an_allowlist_that_cannot_be_read_refuses_everything(tmp_path: Path, content: bytes | None, reason: str
                                                             ) -> None:
    allowlist = tmp_path / "digests"
    if content is not None:
        allowlist.write_bytes(content)
    with pytest.raises(Untrusted, match=reason):
        read_digests(allowlist)
    root = tmp_path / "repository"
    assert "the trusted digests file" in untrusted(root, version(root), allowlist)  # no version loads


def test_without_an_allowlist_any_folder_inside_the_repository_loads(tmp_path: Path) -> None:
    root = tmp_path / "repository"
    check(root, version(root), None)
    (root / "alias").symlink_to(root / "tiny")  # a link that stays inside is fine
    check(root, root / "alias" / "1", None)


def test_a_folder_linked_from_outside_is_refused_without_naming_where(tmp_path: Path) -> None:
    root, outside = tmp_path / "repository", tmp_path / "elsewhere"
    version(outside, "stray")
    (root / "tiny").mkdir(parents=True)
    (root / "tiny" / "2").symlink_to(outside / "stray" / "1")  # the version folder
    (root / "other").symlink_to(outside / "stray")  # the model folder
    for folder, shown in ((root / "tiny" / "2", "tiny/2"), (root / "other" / "1", "other/1")):
        reason = untrusted(root, folder, None)
        assert reason == f"{shown} resolves outside the model repository (symlinks may not leave it)"
        assert str(tmp_path) not in reason


def test_only_listed_module_files_load_and_the_list_is_read_at_every_check(tmp_path: Path) -> None:
    root, allowlist = tmp_path / "repository", tmp_path / "digests"
    folder = version(root)
    digest = sha256_file(folder / ARTIFACT)
    allowlist.write_text(f"{A}\n")
    assert untrusted(root, folder, allowlist) == f"director.ts sha256 {digest} is not in the trusted digests file"
    allowlist.write_text(f"{A}\n{digest}\n")  # an edit takes effect at the next check
    check(root, folder, allowlist)
    (folder / EXPORTED_ARTIFACT).write_bytes(b"compiled code")  # a package is code too
    package = sha256_file(folder / EXPORTED_ARTIFACT)
    assert untrusted(root, folder, allowlist) == f"director.pt2 sha256 {package} is not in the trusted digests file"
    allowlist.write_text(f"{digest}\n{package}\n")
    check(root, folder, allowlist)


def test_a_version_without_its_module_file_is_refused_when_an_allowlist_is_set(tmp_path: Path) -> None:
    root, allowlist = tmp_path / "repository", tmp_path / "digests"
    folder = version(root)
    (folder / ARTIFACT).unlink()
    allowlist.write_text(f"{A}\n")
    assert untrusted(root, folder, allowlist) == "cannot read director.ts: No such file or directory"
    check(root, folder, None)  # without one, loading it reports the missing file instead
