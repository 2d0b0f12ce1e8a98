"""The one place pvegpu's operations build the shell commands that write files.

Every managed file is written atomically: the content goes to a temporary file in the same directory
(`.<name>.pvegpu-new`: a name no `*.conf` / `*.cfg` glob picks up, and the same on every run, so a cut run
leaves at most one), created under `umask 077`, which gets its mode and owner, is synced, read back (sha256)
and optionally checked, then renamed over the target, and the directory is synced. A cut or a failure at any
point leaves the old file as it was; the command then fails with a line naming the path.

`write_file` carries the content on the shell command line (pyinfra prints it under `-vv`, logs it under
`--debug`, and every local user of the host reads `/proc/<pid>/cmdline`): it is for files without a secret.
A file with a secret goes through `upload_secret_file`: the staging file is created empty under `umask 077`,
the content is uploaded into it over pyinfra's file transfer (SFTP/SCP: opening an existing file keeps its
mode), and `install_staged` checks and renames it. No command line holds the content, and the staged file is
never readable by another user. (A host reached with pyinfra's `_sudo` gets uploads through pyinfra's own
temporary file; pvegpu reaches the nodes, where the user-data goes, as root.)

The tools that generate boot files from them (update-grub, proxmox-boot-tool refresh, update-initramfs) run
through `regenerate`: a tool that fails or is killed fails the command with a line naming the tool.
"""

from __future__ import annotations

import hashlib
import io
import posixpath

from pyinfra.api.command import FileUploadCommand, QuoteString, StringCommand


def temp_path(path: str) -> str:
    """Where `write_file` stages the new content of `path`."""
    directory, name = posixpath.split(path)
    return posixpath.join(directory, f".{name}.pvegpu-new")


def write_file(
    path: str, content: str, *, mode: str = "0644", owner: str = "root:root", check: str | None = None
) -> StringCommand:
    """Write `content` to `path` atomically (module docstring); the parent directory must exist.

    `check`: a command that gets the staged file as its last argument (e.g. `sh -n`, as a tool that sources
    the file reads it); when it fails nothing is renamed. The error line: `pvegpu: could not write PATH ...`.
    """
    temp = QuoteString(temp_path(path))
    digest = hashlib.sha256(content.encode()).hexdigest()
    checked = ["&&", *check.split(), temp] if check is not None else []
    failure = f"pvegpu: could not write {path} (left unchanged)"
    return StringCommand(
        "{", "umask", "077", "&&", "printf", "%s", QuoteString(content), ">", temp,
        "&&", "chmod", mode, temp,
        "&&", "chown", owner, temp,
        "&&", "sync", temp,
        "&&", "printf", QuoteString("%s  %s\n"), digest, temp, "|", "sha256sum", "--check", "--status",
        *checked,
        "&&", "mv", "-f", temp, QuoteString(path),
        "&&", "sync", QuoteString(posixpath.dirname(path)), ";", "}",
        "||", "{", "rm", "-f", temp, ";", "echo", QuoteString(failure), ">&2", ";", "exit", "1", ";", "}",
    )  # fmt: skip


def upload_secret_file(
    path: str, content: str, *, mode: str = "0600", owner: str = "root:root"
) -> tuple[StringCommand, FileUploadCommand, StringCommand]:
    """Write `content`, which holds a secret, to `path` atomically without putting it on a command line
    (module docstring): the staging file made empty and root-only (`umask 077`, an old one removed first, so
    a leftover's mode never carries over), the content uploaded into it, then `install_staged`. The
    directory of `path` is created when missing (with its default mode)."""
    temp = QuoteString(temp_path(path))
    failure = f"pvegpu: could not stage {path} (left unchanged)"
    prepare = StringCommand(
        "mkdir", "-p", QuoteString(posixpath.dirname(path)),
        "&&", "rm", "-f", temp,
        "&&", "(", "umask", "077", "&&", ":", ">", temp, ")",
        "||", "{", "echo", QuoteString(failure), ">&2", ";", "exit", "1", ";", "}",
    )  # fmt: skip
    data = content.encode()
    upload = FileUploadCommand(io.BytesIO(data), temp_path(path))
    return prepare, upload, install_staged(path, hashlib.sha256(data).hexdigest(), mode=mode, owner=owner)


def install_staged(path: str, sha256: str, *, mode: str = "0644", owner: str = "root:root") -> StringCommand:
    """Finish writing `path` atomically from content uploaded to `temp_path(path)` (binary content, too large
    for one command line): mode, owner, sync, its sha256 checked against `sha256`, then renamed over `path`
    (module docstring); on any failure the staged file is removed and `path` left as it was."""
    temp = QuoteString(temp_path(path))
    failure = f"pvegpu: could not write {path} (left unchanged)"
    return StringCommand(
        "{", "chmod", mode, temp,
        "&&", "chown", owner, temp,
        "&&", "sync", temp,
        "&&", "printf", QuoteString("%s  %s\n"), sha256, temp, "|", "sha256sum", "--check", "--status",
        "&&", "mv", "-f", temp, QuoteString(path),
        "&&", "sync", QuoteString(posixpath.dirname(path)), ";", "}",
        "||", "{", "rm", "-f", temp, ";", "echo", QuoteString(failure), ">&2", ";", "exit", "1", ";", "}",
    )  # fmt: skip


def regenerate(command: str, generated: str) -> StringCommand:
    """Run `command`, a tool that generates `generated` from pvegpu's files. When it fails or is killed, the
    command fails with its exit status and the line `pvegpu: COMMAND failed (exit N); the next run checks
    GENERATED and runs it again` (the operations decide the refresh from the generated state)."""
    failure = f"pvegpu: {command} failed (exit %s); the next run checks {generated} and runs it again\n"
    return StringCommand(
        *command.split(),
        "||", "{", "rc=$?", ";", "printf", QuoteString(failure), '"$rc"', ">&2", ";",
        "exit", '"$rc"', ";", "}",
    )  # fmt: skip
