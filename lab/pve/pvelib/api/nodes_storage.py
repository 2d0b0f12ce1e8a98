"""`/nodes/{node}/storage/{storage}/...`: content, volume delete, download-url (pve-storage
API2/Storage/Content.pm, pve-manager API2/Storage's download-url)."""

from __future__ import annotations

import hashlib
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import access
from ..errors import DieError, ParamError
from ..formats import BOOL, VOLUME_ID, verify_content, verify_vmid
from ..guest_config import LXC_DIR, QEMU_DIR
from ..jsonschema import P
from ..permissions import check_volume_access
from ..pmxcfs import locked, read_bytes
from ..rest import Call, Endpoint, Json
from ..storage import (
    IMPORT_EXT,
    ISO_EXT,
    LAB_VOLUMES,
    SAFE_CHARS,
    SUBDIRS,
    UPLOAD_IMPORT_EXT,
    VZTMPL_EXT,
    Storage,
    image_size,
    parse_size,
    parse_volume,
    storage_config,
)
from ..tasks import run_task

if TYPE_CHECKING:
    from ..settings import Settings


def decoded_content(storage: Storage, value: str) -> str:
    kept: list[str] = []
    for content in [c for c in re.split(r"[,;\s]+", value) if c]:
        if content not in storage.valid_content:
            sys.stderr.write(f"storage does not support content type '{content}'\n")
        elif content not in kept:
            kept.append(content)
    if "none" in kept and len(kept) > 1:
        raise DieError("unable to combine 'none' with other content types\n")
    if not kept:
        raise DieError("storage does not support content type 'none'\n")
    return ",".join(kept)


def list_storage_content(call: Call) -> Json:
    """Storage::volume_list: the content types asked for that the storage has, sorted by volid."""
    settings = call.settings
    storage = storage_config(settings, call.path_params["storage"])
    wanted = [call.params["content"]] if "content" in call.params else list(SUBDIRS)
    vmid = str(call.params["vmid"]) if "vmid" in call.params else None
    result: list[dict[str, Any]] = []
    for content in [c for c in wanted if c in storage.content]:
        if content in ("images", "rootdir"):
            items = [i for i in list_images(settings, storage, vmid) if i["content"] == content]
        elif storage.path is not None and content in ("iso", "vztmpl", "snippets", "import", "backup"):
            if vmid is not None and content in ("iso", "vztmpl"):
                continue
            items = _list_files(settings, storage, content)
        else:
            continue
        result.extend(items)
    if not call.rpcenv.is_root:  # Content.pm index: each volume the caller may access
        result = [item for item in result if _may_access(call, item["volid"])]
    return sorted(result, key=lambda item: item["volid"].lower())


def _may_access(call: Call, volid: str) -> bool:
    try:
        check_volume_access(call, volid, None)
    except (DieError, access.PermissionDenied):
        return False
    return True


def list_images(settings: Settings, storage: Storage, vmid: str | None) -> list[dict[str, Any]]:
    if storage.path is not None:
        pattern, folder = r"(\d+)/((?:vm|base)-(\d+)-\S+\.(raw|qcow2|vmdk|subvol))", f"{storage.path}/images"
        files = [f"{p.parent.name}/{p.name}" for p in settings.path(folder).glob("[0-9]*/*")]
    else:
        pattern, folder = r"()((?:vm|base)-(\d+)-\S+)()", f"{LAB_VOLUMES}/{storage.id}"
        files = [p.name for p in settings.path(folder).glob("*")]
    items = []
    for rel in files:
        match = re.fullmatch(pattern, rel)
        if not match or (vmid is not None and match.group(3) != vmid):
            continue
        owner = match.group(3)
        data = settings.path(f"{folder}/{rel}")
        volid = f"{storage.id}:{rel}"
        is_ct = settings.path(f"{LXC_DIR}/{owner}.conf").is_file()
        item = {
            "volid": volid,
            "format": match.group(4) or "raw",
            "size": _volume_size(settings, volid, owner, data),
            "used": data.stat().st_size,
            "vmid": int(owner),
            "ctime": int(data.stat().st_ctime),
            "content": "rootdir" if is_ct else "images",
        }
        items.append(item)
    return items


def _volume_size(settings: Settings, volid: str, owner: str, data: Path) -> int:
    """A volume's size: the `size=` its guest's config records (the stand-in's volumes are small files),
    else its image size."""
    for folder in (QEMU_DIR, LXC_DIR):
        conf = read_bytes(settings.path(f"{folder}/{owner}.conf")).decode()
        for line in conf.splitlines():
            found = re.match(rf"[a-z]+\d+: (?:file=)?{re.escape(volid)},(?:.*,)?size=([^,]+)", line)
            if found and parse_size(found.group(1)) is not None:
                return parse_size(found.group(1)) or 0
    return image_size(data)


def _list_files(settings: Settings, storage: Storage, content: str) -> list[dict[str, Any]]:
    """Plugin.pm $get_subdir_files: the files of a content type's directory that its pattern accepts."""
    folder = settings.path(f"{storage.path}/{SUBDIRS[content]}")
    items = []
    for data in sorted(folder.glob("*")) if folder.is_dir() else []:
        if data.is_dir():
            continue
        name = data.name
        if content == "iso":
            if not re.fullmatch(rf"[^/]+{ISO_EXT}", name, re.IGNORECASE):
                continue
            item: dict[str, Any] = {"volid": f"{storage.id}:iso/{name}", "format": "iso"}
        elif content == "vztmpl":
            found = re.fullmatch(rf"[^/]+{VZTMPL_EXT}", name)
            if not found:
                continue
            fmt = "tar" if found.group(1) else f"t{found.group(2)}"
            item = {"volid": f"{storage.id}:vztmpl/{name}", "format": fmt}
        elif content == "snippets":
            item = {"volid": f"{storage.id}:snippets/{name}", "format": "snippet"}
        elif content == "import":
            found = re.fullmatch(rf"{SAFE_CHARS}+{IMPORT_EXT}", name, re.IGNORECASE)
            if not found:
                continue
            item = {"volid": f"{storage.id}:import/{name}", "format": found.group(1)}
        else:
            continue  # backups: not modelled
        stat_result = data.stat()
        item.update(size=stat_result.st_size, ctime=int(stat_result.st_ctime), content=content)
        items.append(item)
    return items


def delete_volume(call: Call) -> Json:
    """Content.pm `delete` (task `imgdel`, id `<owner>@<storage>`): `{volume}` is a volid (its storage must
    be `{storage}`: `storage ID mismatch (a != b)`) or a volname on `{storage}`; Datastore.Allocate on the
    storage (backups: not modelled); vdisk_free: a data file that is not there is a warning (Plugin.pm
    free_image), the task still ends."""
    storeid, volume = call.path_params["storage"], call.path_params["volume"]
    if ":" in volume:
        match = VOLUME_ID.fullmatch(volume)
        if match is None:
            raise ParamError({"volume": f"unable to parse volume ID '{volume}'"})
        if match.group(1) != storeid:
            raise ParamError({"volume": f"storage ID mismatch ({match.group(1)} != {storeid})"})
        volid = volume
    else:
        volid = f"{storeid}:{volume}"
    found = parse_volume(call.settings, volid)
    call.rpcenv.check(call.rpcenv.user, f"/storage/{found.storage.id}", ("Datastore.Allocate",))
    data = call.settings.path(found.file)

    def worker(emit: Callable[[str], None]) -> None:
        with locked(call.settings):
            if not data.is_file():
                emit(f"WARN: disk image '{found.file}' does not exist")
            data.unlink(missing_ok=True)
            emit(f"Removed volume '{volid}'")

    owner = f"{found.vmid}@" if found.vmid is not None else ""
    return run_task(call, "imgdel", f"{owner}{found.storage.id}", worker)


def download_url(call: Call) -> Json:
    """Status.pm `download_url`: checks before the task, then Tools::download_file_from_url in the task
    `download` (worker id: the file name). The stand-in fetches with urllib instead of wget."""
    settings, params = call.settings, call.params
    storage = storage_config(settings, call.path_params["storage"])
    if storage.options.get("disable") == "1":
        raise DieError(f"storage '{storage.id}' is disabled\n")
    if storage.path is None:
        raise DieError(f"can't upload to storage type '{storage.type}', not a file based storage!\n")
    content = params["content"]
    if content not in storage.content:
        raise DieError(f"storage '{storage.id}' is not configured for content-type '{content}'\n")
    # PVE::Storage::normalize_content_filename: chomp, the part after the last (back)slash, then every
    # character outside [a-zA-Z0-9_.-] made `_`; the file (and its volume) has that name.
    filename = re.sub(r"[^a-zA-Z0-9_.-]", "_", re.sub(r"^.*[/\\]", "", params["filename"].removesuffix("\n")))
    if content == "iso" and not re.search(rf"[^/]+{ISO_EXT}$", filename, re.IGNORECASE):
        raise ParamError({"filename": "wrong file extension"})
    if content == "vztmpl" and not re.search(rf"[^/]+{VZTMPL_EXT}$", filename, re.IGNORECASE):
        raise ParamError({"filename": "wrong file extension"})
    if content == "import" and not re.search(rf"{SAFE_CHARS}+{UPLOAD_IMPORT_EXT}$", filename):
        raise ParamError({"filename": "invalid filename or wrong extension"})
    dest = f"{storage.path}/{SUBDIRS[content]}/{filename}"
    settings.path(dest).parent.mkdir(parents=True, exist_ok=True)

    def worker(emit: Callable[[str], None]) -> None:
        if "compression" in params and content != "iso":
            raise DieError(f"decompression not supported for {content}\n")
        _download(params, settings.path(dest), dest, emit)

    return run_task(call, "download", filename, worker)


def _download(params: dict[str, Any], target: Path, dest: str, emit: Callable[[str], None]) -> None:
    url, algorithm = params["url"], params.get("checksum-algorithm")
    expected = str(params.get("checksum", ""))
    emit(f"downloading {url} to {dest}")
    if target.exists():
        if not algorithm:
            raise DieError(f"refusing to override existing file '{dest}'\n")
        got = _file_hash(algorithm, target)
        if got == expected.lower():
            emit("calculating checksum of existing file...OK, got correct file already, no need to download")
            return
        emit("calculating checksum of existing file...")
        raise DieError(f"checksum mismatch: got '{got}' != expect '{expected}', aborting\n")
    # Imported here: only a download needs them, and every other call would pay their import (~25 ms).
    import ssl  # noqa: PLC0415
    import urllib.error  # noqa: PLC0415
    import urllib.request  # noqa: PLC0415

    partial = target.with_name(f"{target.name}.tmp_dwnl.{os.getpid()}")
    context = ssl.create_default_context()
    if not params.get("verify-certificates", 1):
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    try:
        try:
            with urllib.request.urlopen(url, timeout=60, context=context) as answer:
                partial.write_bytes(answer.read())
        except (OSError, ValueError) as error:
            # wget's exit codes: 8 = the server answered with an error, 4 = network failure.
            code = 8 if isinstance(error, urllib.error.HTTPError) else 4
            command = f"wget --progress=dot:giga -O {dest}.tmp_dwnl.{os.getpid()} {url}"
            raise DieError(f"download failed: command '{command}' failed: exit code {code}\n") from None
        if algorithm:
            got = _file_hash(algorithm, partial)
            if got != expected.lower():
                emit("calculating checksum...")
                raise DieError(f"checksum mismatch: got '{got}' != expect '{expected}'\n")
            emit("calculating checksum...OK, checksum verified")
        if "compression" in params:
            partial.write_bytes(_decompressed(params["compression"], partial.read_bytes()))
        partial.rename(target)
    finally:
        partial.unlink(missing_ok=True)
    emit(f"download of '{url}' to '{dest}' finished")


def _file_hash(algorithm: str, path: Path) -> str:
    return hashlib.new(algorithm, path.read_bytes()).hexdigest()


def _decompressed(compression: str, data: bytes) -> bytes:
    import bz2  # noqa: PLC0415  (only a download needs them, as above)
    import gzip  # noqa: PLC0415

    if compression == "gz":
        return gzip.decompress(data)
    if compression == "bz2":
        return bz2.decompress(data)
    raise DieError(f"decompression of '{compression}' is not modelled by the lab stand-in\n")


ROUTES: list[tuple[str, str, Endpoint]] = [
    (
        "delete",
        r"nodes/(?P<node>[^/]+)/storage/(?P<storage>[^/]+)/content/(?P<volume>.+)",
        Endpoint("DELETE", {"delay": P(type="integer", minimum=1, maximum=30)}, delete_volume),
    ),
    (
        "get",
        r"nodes/(?P<node>[^/]+)/storage/(?P<storage>[^/]+)/content",
        Endpoint(
            "GET",
            {"content": P(verify=verify_content), "vmid": P(type="integer", verify=verify_vmid, minimum=100)},
            list_storage_content,
        ),
    ),
    (
        "create",
        r"nodes/(?P<node>[^/]+)/storage/(?P<storage>[^/]+)/download-url",
        Endpoint(
            "POST",
            {
                "url": P(optional=False, pattern=r"https?://.*"),
                "content": P(optional=False, verify=verify_content, enum=("iso", "vztmpl", "import")),
                "filename": P(optional=False, max_length=255),
                "checksum": P(requires="checksum-algorithm"),
                "checksum-algorithm": P(
                    enum=("md5", "sha1", "sha224", "sha256", "sha384", "sha512"), requires="checksum"
                ),
                "compression": P(enum=("gz", "lzo", "zst", "bz2")),
                "verify-certificates": BOOL,
            },
            download_url,
        ),
    ),
]


PERMISSIONS: dict[tuple[str, str], access.Permissions] = {
    ("GET", "/nodes/{node}/storage/{storage}/content"): access.Perm(
        "/storage/{storage}", ("Datastore.Audit", "Datastore.AllocateSpace"), any=True
    ),
    ("DELETE", "/nodes/{node}/storage/{storage}/content/{volume}"): access.ALL_USERS,  # checked inside,
    ("POST", "/nodes/{node}/storage/{storage}/download-url"): access.And(
        (
            access.Perm("/storage/{storage}", ("Datastore.AllocateTemplate",)),
            access.Or(
                (
                    access.Perm("/", ("Sys.Audit", "Sys.Modify")),
                    access.Perm("/nodes/{node}", ("Sys.AccessNetwork",)),
                )
            ),
        )
    ),
}
