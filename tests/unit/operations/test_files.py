"""operations.files: the exact atomic write command and the tool runner, and what they do in a real shell."""

from __future__ import annotations

import grp
import os
import pwd
import subprocess
from pathlib import Path

from pvegpu.operations.files import regenerate, temp_path, upload_secret_file, write_file


def test_write_file_command_stages_checks_and_renames() -> None:
    command = write_file("/etc/default/grub.d/pvegpu.cfg", 'A="1"\n', check="sh -n").get_raw_value()
    temp = "/etc/default/grub.d/.pvegpu.cfg.pvegpu-new"
    assert command == (
        f"{{ umask 077 && printf %s 'A=\"1\"\n' > {temp} && chmod 0644 {temp} && chown root:root {temp} && "
        f"sync {temp} && "
        "printf '%s  %s\n' 4cc760ca1d1acf2027db2e821fcda46fccbd680296696ecf877ab0a307a7db15 "
        f"{temp} | sha256sum --check --status && sh -n {temp} && mv -f {temp} /etc/default/grub.d/pvegpu.cfg "
        f"&& sync /etc/default/grub.d ; }} || {{ rm -f {temp} ; "
        "echo 'pvegpu: could not write /etc/default/grub.d/pvegpu.cfg (left unchanged)' >&2 ; exit 1 ; }"
    )


def _run(command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", "-c", command], check=False, capture_output=True, text=True)


def _owner() -> str:
    return f"{pwd.getpwuid(os.getuid()).pw_name}:{grp.getgrgid(os.getgid()).gr_name}"


def test_write_file_replaces_the_file_with_mode_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "pvegpu.cfg"
    target.write_text("old\n")
    target.chmod(0o600)

    result = _run(write_file(str(target), "it's new\n", mode="0644", owner=_owner()).get_raw_value())

    assert (result.returncode, result.stderr) == (0, "")
    assert target.read_text() == "it's new\n"
    assert target.stat().st_mode & 0o777 == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pvegpu.cfg"]


def test_error_a_failing_check_leaves_the_old_file_and_names_the_path(tmp_path: Path) -> None:
    target = tmp_path / "pvegpu.cfg"
    target.write_text('GRUB_CMDLINE_LINUX="ok"\n')

    command = write_file(str(target), 'GRUB_CMDLINE_LINUX="cut\n', owner=_owner(), check="sh -n")
    result = _run(command.get_raw_value())

    assert result.returncode == 1
    assert result.stderr.endswith(f"pvegpu: could not write {target} (left unchanged)\n")
    assert target.read_text() == 'GRUB_CMDLINE_LINUX="ok"\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pvegpu.cfg"]


def test_error_a_missing_directory_names_the_path(tmp_path: Path) -> None:
    target = tmp_path / "absent" / "cmdline"

    result = _run(write_file(str(target), "root=x\n", owner=_owner()).get_raw_value())

    assert result.returncode == 1
    assert result.stderr.endswith(f"pvegpu: could not write {target} (left unchanged)\n")
    assert not target.parent.exists()


def test_regenerate_command_names_the_tool_when_it_fails() -> None:
    command = regenerate("update-grub", "/boot/grub/grub.cfg").get_raw_value()
    assert command == (
        "update-grub || { rc=$? ; printf 'pvegpu: update-grub failed (exit %s); the next run checks "
        '/boot/grub/grub.cfg and runs it again\n\' "$rc" >&2 ; exit "$rc" ; }'
    )


def test_regenerate_a_tool_that_succeeds_says_nothing(tmp_path: Path) -> None:
    result = _run(regenerate(f"touch {tmp_path}/grub.cfg", "grub.cfg").get_raw_value())

    assert (result.returncode, result.stderr) == (0, "")
    assert (tmp_path / "grub.cfg").exists()


def test_error_a_killed_tool_fails_with_its_status_and_a_line_naming_it(tmp_path: Path) -> None:
    tool = tmp_path / "refresh"
    tool.write_text("#!/bin/sh\nkill -9 $$\n")
    tool.chmod(0o755)

    result = _run(regenerate(f"{tool} all", "the ESPs' loader entries").get_raw_value())

    assert result.returncode == 137
    assert result.stderr.endswith(
        f"pvegpu: {tool} all failed (exit 137); the next run checks the ESPs' loader entries and runs it "
        "again\n"
    )


def test_a_secret_file_is_staged_root_only_uploaded_and_renamed(tmp_path: Path) -> None:
    target = tmp_path / "snippets" / "user.yaml"
    staged = Path(temp_path(str(target)))
    staged.parent.mkdir()
    staged.write_text("a leftover of a cut run\n")
    staged.chmod(0o644)
    prepare, upload, install = upload_secret_file(str(target), "key: Zq9-body\n", owner=_owner())

    assert _run(prepare.get_raw_value()).returncode == 0
    assert (staged.read_text(), oct(staged.stat().st_mode & 0o777)) == ("", "0o600")  # before any content
    assert upload.dest == str(staged)
    assert "Zq9-body" not in repr(upload)  # what pyinfra's --debug logs of an upload
    staged.write_bytes(upload.src.read())  # type: ignore[union-attr]  # what pyinfra's SFTP put does
    result = _run(install.get_raw_value())

    assert (result.returncode, result.stderr) == (0, "")
    assert (target.read_text(), oct(target.stat().st_mode & 0o777)) == ("key: Zq9-body\n", "0o600")
    assert sorted(p.name for p in target.parent.iterdir()) == ["user.yaml"]
    assert "Zq9-body" not in prepare.get_raw_value() + install.get_raw_value()


def test_error_a_secret_file_whose_upload_was_cut_is_not_renamed(tmp_path: Path) -> None:
    target = tmp_path / "user.yaml"
    target.write_text("old\n")
    prepare, _, install = upload_secret_file(str(target), "key: Zq9-body\n", owner=_owner())
    _run(prepare.get_raw_value())  # the upload never came: the staged file is still empty

    result = _run(install.get_raw_value())

    assert (result.returncode, result.stderr) == (1, f"pvegpu: could not write {target} (left unchanged)\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["user.yaml"]
    assert target.read_text() == "old\n"
