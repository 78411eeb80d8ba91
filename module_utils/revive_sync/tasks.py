"""The modules' work, one function per module: parameters in, a result dict out (changed, diff, facts)."""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from typing import Callable, List, Optional, Sequence

from ansible.module_utils.revive_files import write_json_atomic
from ansible.module_utils.revive_sync.convert import CONVERT_CHUNK_VALUES, convert_model_bf16_to_fp16
from ansible.module_utils.revive_sync.dtype import DtypeDecision, DtypePolicy, decide_dtypes
from ansible.module_utils.revive_sync.errors import SyncError, format_bytes
from ansible.module_utils.revive_sync.manifest import (
    MANIFEST_NAME,
    SAFETENSORS_SUFFIX,
    DtypeReader,
    Manifest,
    build_manifest,
    load_manifest,
    scan_tree,
)
from ansible.module_utils.revive_sync.mounts import classify_destination, read_mountinfo
from ansible.module_utils.revive_sync.promote import (
    converting_path,
    current_link_state,
    group_id,
    link_target,
    promote_tree,
    promoted_manifest,
    promoted_state,
    staging_path,
    swap_symlink,
)
from ansible.module_utils.revive_sync.rsync import RsyncSource, remove_files, run_rsync
from ansible.module_utils.revive_sync.space import check_free_space
from ansible.module_utils.revive_sync.verify import (
    invalidate_verified,
    mark_verified,
    pending_transfer,
    verified_manifest,
    verify_tree,
)


def _diff_lines(title: str, lines: Sequence[str]) -> str:
    return "".join(f"{title}{line}\n" for line in lines)


def manifest_task(source_dir: str, *, refresh: bool, check_mode: bool, workers: int, read_dtypes: DtypeReader,
                  where: str) -> dict:
    """Read the manifest kept beside the model, or make it (and keep it there when the source is writable)."""
    if not os.path.isdir(source_dir):
        raise SyncError(f"source model directory {source_dir} does not exist on {where}: check "
                        f"model_sync_source_path (and model_sync_source_type)")
    manifest_path = os.path.join(source_dir, MANIFEST_NAME)
    if os.path.exists(manifest_path) and not refresh:
        manifest = load_manifest(manifest_path)
        report = verify_tree(source_dir, manifest, workers=workers, quick=True)
        if not report.ok:
            raise SyncError(
                f"the manifest {manifest_path} on {where} no longer matches the files beside it ({report.summary()}): "
                f"the model was changed after the manifest was made. Check the source, then set "
                f"model_sync_manifest_refresh: true to make a new manifest.")
        return {"changed": False, "created": False, "written": False, "manifest_path": manifest_path,
                "manifest": manifest.to_dict(), "warnings": []}
    manifest = build_manifest(source_dir, read_dtypes=read_dtypes, workers=workers)
    result = {"changed": True, "created": True, "written": False, "manifest_path": manifest_path,
              "manifest": manifest.to_dict(), "warnings": [],
              "diff": {"before": "", "after": _diff_lines("", [f"{entry.path} {entry.size} {entry.sha256}"
                                                                for entry in manifest.files]),
                       "before_header": manifest_path, "after_header": manifest_path}}
    if check_mode:
        return result
    try:
        write_json_atomic(manifest_path, manifest.to_dict())
        result["written"] = True
    except OSError as exc:
        result["changed"] = False
        result["warnings"].append(
            f"could not keep the manifest beside the model at {manifest_path} on {where} ({exc.strerror}); it is "
            f"made again on every run until the source directory is writable for a moment")
    return result


def preflight_task(dest: str, manifest: Manifest, *, margin_bytes: int, gpu_bf16: bool, convert_bf16: bool,
                   allowed_dtypes: Sequence[str], full_reverify: bool, workers: int, where: str,
                   mountinfo_text: Optional[str] = None, free_bytes: Optional[int] = None) -> dict:
    """Every refusal that can be made before a byte moves; changes nothing."""
    destination = classify_destination(dest, read_mountinfo() if mountinfo_text is None else mountinfo_text)
    refusal = destination.refusal(where)
    if refusal:
        raise SyncError(refusal)
    decision = decide_dtypes(manifest.dtypes(), gpu_bf16=gpu_bf16, convert_bf16=convert_bf16,
                             allowed_dtypes=allowed_dtypes, where=where)
    if decision.error:
        raise SyncError(decision.error)
    state = promoted_state(dest, manifest, workers=workers, full=full_reverify)
    staging = staging_path(dest)
    if state.up_to_date:
        transfer_bytes, convert_bytes = 0, 0
    else:
        transfer_bytes = pending_transfer(staging, manifest)[0]
        by_path = manifest.by_path()
        convert_bytes = sum(by_path[path].size for path in decision.bf16_files) if decision.convert_bf16 else 0
    space = check_free_space(dest, transfer_bytes=transfer_bytes, convert_bytes=convert_bytes,
                             margin_bytes=margin_bytes, free_bytes=free_bytes)
    refusal = space.refusal(where)
    if refusal:
        raise SyncError(refusal)
    return {
        "changed": False,
        "dest": dest,
        "staging": staging,
        "converting": converting_path(dest),
        "filesystem": {"mount_point": destination.mount_point, "fstype": destination.fstype,
                       "source": destination.source, "kind": destination.kind},
        "space": {"free_bytes": space.free_bytes, "needed_bytes": space.needed_bytes,
                  "transfer_bytes": space.transfer_bytes, "convert_bytes": space.convert_bytes,
                  "margin_bytes": space.margin_bytes},
        "up_to_date": state.up_to_date,
        "promoted_reason": state.reason,
        "content_id": manifest.content_id,
        "model_bytes": manifest.total_bytes,
        "dtypes": list(decision.dtypes),
        "bf16_files": list(decision.bf16_files),
        "convert_bf16": decision.convert_bf16,
    }

def _check_staged_headers(staging: str, manifest: Manifest, read_dtypes: DtypeReader, policy: DtypePolicy,
                          where: str) -> DtypeDecision:
    """Parse every staged safetensors header (errors name the file) and apply the dtype policy to what is there."""
    dtypes = {entry.path: read_dtypes(os.path.join(staging, entry.path))
              for entry in manifest.files if entry.path.endswith(SAFETENSORS_SUFFIX)}
    decision = decide_dtypes(dtypes, gpu_bf16=policy.gpu_bf16, convert_bf16=policy.convert_bf16,
                             allowed_dtypes=policy.allowed_dtypes, where=where)
    if decision.error:
        raise SyncError(decision.error)
    return decision


def stage_task(source: Optional[RsyncSource], staging: str, manifest: Manifest, *, repair: bool, check_mode: bool,
               workers: int, read_dtypes: DtypeReader, policy: DtypePolicy, where: str, bwlimit_kib: int = 0,
               io_timeout_s: int = 300, popen: Callable[..., subprocess.Popen] = subprocess.Popen) -> dict:
    """Bring staging to exactly the manifest (rsync when `source` is given), verify it, and mark it verified.

    Files found corrupt are removed and, with a source, fetched once more. Without a source (the controller
    pushed the files), the removed files are returned in `refetch` for the caller to push again.
    """
    result: dict = {"changed": False, "staging": staging, "content_id": manifest.content_id, "transferred": [],
                    "bytes_received": 0, "literal_bytes": 0, "remainder_bytes": 0, "repaired": [], "refetch": [],
                    "hashed_during_transfer": 0, "verify": None, "convert_bf16": False}
    already = verified_manifest(staging)
    if already is not None and already.content_id == manifest.content_id:
        decision = _check_staged_headers(staging, manifest, read_dtypes, policy, where)
        result.update(verified=True, convert_bf16=decision.convert_bf16, msg="staging already verified")
        return result
    remainder, pending, extra = pending_transfer(staging, manifest)
    result["remainder_bytes"] = remainder
    if check_mode:
        result.update(changed=True, verified=False, transferred=pending, msg=(
            f"would transfer {format_bytes(remainder)} in {len(pending)} file(s), remove {len(extra)} extra, "
            f"then verify {len(manifest.files)} file(s)"))
        result["diff"] = {"before": _diff_lines("", sorted(set(scan_tree(staging)) if os.path.isdir(staging) else [])),
                          "after": _diff_lines("", [entry.path for entry in manifest.files]),
                          "before_header": staging, "after_header": staging}
        return result
    os.makedirs(os.path.dirname(staging), mode=0o755, exist_ok=True)
    os.makedirs(staging, mode=0o700, exist_ok=True)
    invalidate_verified(staging)
    moved = []
    started = time.monotonic()
    if source is not None:
        moved.append(run_rsync(source, staging, manifest, workers=workers, bwlimit_kib=bwlimit_kib,
                               io_timeout_s=io_timeout_s, where=where, popen=popen))
    transferred_at = time.monotonic()
    report = verify_tree(staging, manifest, workers=workers)
    if not report.ok and repair:
        removed = remove_files(staging, report.corrupt + report.extra)
        result["repaired"] = removed
        if source is None:
            result.update(changed=True, verified=False, refetch=removed, verify=report.to_dict(),
                          msg=f"removed {len(removed)} corrupt file(s) from {staging}; push them again")
            return result
        moved.append(run_rsync(source, staging, manifest, workers=workers, bwlimit_kib=bwlimit_kib,
                               io_timeout_s=io_timeout_s, where=where, popen=popen))
        report = verify_tree(staging, manifest, workers=workers)
        if not report.ok:
            raise SyncError(
                f"the staged copy {staging} on {where} still differs from the manifest after fetching the bad files "
                f"again ({report.summary()}): the source files no longer match their manifest. Check the model at "
                f"the source, then set model_sync_manifest_refresh: true to make a new manifest.")
    if not report.ok:
        raise SyncError(f"the staged copy {staging} on {where} does not match the manifest: {report.summary()}. "
                        f"Run again to fetch the missing or corrupt files.")
    decision = _check_staged_headers(staging, manifest, read_dtypes, policy, where)
    mark_verified(staging, manifest)
    result["seconds"] = {"transfer": round(transferred_at - started, 2),
                         "verify_after_transfer": round(time.monotonic() - transferred_at, 2)}
    for stage in moved:
        result["transferred"] += stage.transferred
        result["bytes_received"] += stage.stats.bytes_received
        result["literal_bytes"] += stage.stats.literal_bytes
        result["hashed_during_transfer"] += stage.hashed_during_transfer
    if moved:
        result["rsync_argv"] = moved[0].argv
    result.update(changed=True, verified=True, verify=report.to_dict(), convert_bf16=decision.convert_bf16,
                  msg=f"staged and verified {len(manifest.files)} file(s), {format_bytes(manifest.total_bytes)}")
    return result


def promote_task(dest: str, source_content_id: str, *, candidates: Sequence[str], group: str, current_link: str,
                 update_current: bool, fsync: bool, check_mode: bool, cleanup: Sequence[str] = ()) -> dict:
    """Rename the verified copy to `dest` and point `current` at it; nothing when dest already holds the source."""
    actions: List[str] = []
    before: List[str] = []
    after: List[str] = []
    installed = promoted_manifest(dest)
    up_to_date = installed is not None and installed.source_content_id == source_content_id and \
        verify_tree(dest, installed, workers=1, quick=True).ok
    chosen = None
    if not up_to_date:
        for candidate in candidates:
            verified = verified_manifest(candidate)
            if verified is not None and verified.source_content_id == source_content_id:
                chosen = candidate
                break
        if chosen is None and not check_mode:
            raise SyncError(f"nothing verified to promote to {dest}: none of {', '.join(candidates)} holds a verified "
                            f"copy of content id {source_content_id[:12]}. Run the transfer and verify phases "
                            f"(tags model_sync_transfer, model_sync_verify) first.")
        before.append(f"{dest}: {installed.content_id if installed else 'absent'}")
        after.append(f"{dest}: verified copy of {source_content_id}")
        actions.append(f"promote {chosen or 'the staged copy'} to {dest}")
    gid = group_id(group)
    if gid is None and chosen is not None and not check_mode:
        raise SyncError(f"group {group} does not exist; model_sync creates it in its transfer phase "
                        f"(model_sync_service_group)")
    target = link_target(dest, current_link)
    link_now = current_link_state(current_link) if update_current else None
    if update_current and link_now != target:
        before.append(f"{current_link} -> {link_now or '(absent)'}")
        after.append(f"{current_link} -> {target}")
        actions.append(f"point {current_link} at {target}")
    pending = set(candidates) if chosen is None and not up_to_date else {chosen}
    leftovers = [path for path in cleanup if os.path.lexists(path) and path not in pending]
    actions += [f"remove {path}" for path in leftovers]
    changed = bool(actions)
    result = {"changed": changed, "dest": dest, "current_link": current_link, "actions": actions,
              "promoted_from": chosen, "up_to_date": up_to_date,
              "diff": {"before": _diff_lines("", before), "after": _diff_lines("", after)}}
    if check_mode or not changed:
        return result
    if chosen is not None:
        promote_tree(chosen, dest, gid, fsync=fsync)
    if update_current and link_now != target:
        swap_symlink(current_link, target)
    for path in leftovers:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    return result


def convert_task(staging: str, output_dir: str, source_content_id: str, *, overflow_policy: str, check_mode: bool,
                 where: str, chunk_values: int = CONVERT_CHUNK_VALUES) -> dict:
    """BF16 → FP16 from the verified staging copy into output_dir, unless output_dir already holds that result."""
    done = verified_manifest(output_dir)
    if done is not None and done.source_content_id == source_content_id and done.converted_from:
        return {"changed": False, "output_dir": output_dir, "content_id": done.content_id,
                "report": done.converted_from, "msg": "the FP16 copy is already made and verified"}
    staged = verified_manifest(staging)
    if staged is None or staged.content_id != source_content_id:
        if check_mode:
            return {"changed": True, "output_dir": output_dir, "msg": "would convert the staged copy once verified"}
        raise SyncError(f"the staged copy {staging} on {where} is not verified against content id "
                        f"{source_content_id[:12]}; run the transfer phase (tag model_sync_transfer) first")
    bf16 = [entry.path for entry in staged.files if entry.dtypes and "BF16" in entry.dtypes]
    if check_mode:
        return {"changed": True, "output_dir": output_dir, "msg": f"would convert {len(bf16)} BF16 shard(s) to FP16",
                "diff": {"before": _diff_lines("BF16 ", bf16), "after": _diff_lines("F16  ", bf16)}}
    report = convert_model_bf16_to_fp16(staging, output_dir, staged, overflow_policy=overflow_policy, where=where,
                                        chunk_values=chunk_values)
    return {"changed": True, "output_dir": output_dir, "content_id": report["content_id"], "report": report,
            "msg": (f"converted {len(report['shards'])} shard(s), {report['converted_values']} values; "
                    f"{report['overflow_values']} beyond ±65504 ({overflow_policy}), "
                    f"{report['underflow_values']} flushed to zero")}
