#!/usr/bin/env python3
"""Reopens the tensors of a legacy CUDA IPC arena with PyTorch's own
torch.multiprocessing.reductions.rebuild_cuda_tensor (docs/cuda.md,
"Legacy CUDA IPC"), as a consumer of an ipc = "legacy" endpoint does.
Run by tests/server/test_gpu_legacy.c.

usage: legacy_reopen.py HANDLE_HEX DEVICE_INDEX STORAGE_BYTES UUID TENSOR...
  HANDLE_HEX     the arena's ipc_handle, 64 bytes as 128 hex digits
  DEVICE_INDEX   the arena's device_index (the server's ordinal)
  STORAGE_BYTES  the arena's storage_bytes
  UUID           the arena's uuid ("GPU-..."): the device is looked up by
                 it, so a different CUDA_VISIBLE_DEVICES still finds it
  TENSOR         name:dtype:offset:shape:strides, shape and strides as
                 comma-separated integers (empty for a scalar)

For each tensor it prints one line on stdout:
  T <name> <device index> <is_cuda 0/1> <sum> <hex of the bytes, row-major>
Exit status: 0, 2 on bad arguments, 3 without torch or CUDA.
"""
import sys

try:
    import torch
    from torch.multiprocessing.reductions import rebuild_cuda_tensor
except Exception as e:  # pragma: no cover - reported to the test
    print("no torch: %s" % e, file=sys.stderr)
    sys.exit(3)

DTYPES = {
    "float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
    "bfloat16": torch.bfloat16, "int8": torch.int8, "uint8": torch.uint8,
    "int16": torch.int16, "int32": torch.int32, "int64": torch.int64, "bool": torch.bool,
}

# A ref-counter file that does not exist: torch reports nothing and skips
# it. The server keeps the allocation alive (managed object), so no
# producer-side counting is needed.
REF_COUNTER = b"/sharedtensor-legacy-no-refcounter"


def ints(text):
    return [int(x) for x in text.split(",") if x != ""]


def device_for(uuid, fallback):
    """This process's index of the device named by uuid, else fallback."""
    want = uuid.lower().removeprefix("gpu-")
    for i in range(torch.cuda.device_count()):
        u = getattr(torch.cuda.get_device_properties(i), "uuid", None)
        if u is not None and str(u).lower().removeprefix("gpu-") == want:
            return i
    return fallback


def main(argv):
    if len(argv) < 5:
        print(__doc__, file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("torch sees no CUDA device", file=sys.stderr)
        return 3
    handle = bytes.fromhex(argv[1])
    if len(handle) != 64:
        print("the handle must be 64 bytes", file=sys.stderr)
        return 2
    device = device_for(argv[4], int(argv[2]))
    storage_bytes = int(argv[3])
    storage_cls = torch.storage.TypedStorage
    for spec in argv[5:]:
        name, dtype, offset, shape, strides = spec.split(":")
        offset = int(offset)
        dt = DTYPES[dtype]
        # The 15 arguments (docs/design.md, section 7): the storage starts at the tensor's
        # byte offset in the allocation and runs to the end of the data;
        # the tensor starts at element 0 of it. No event: the server
        # synchronized before replying.
        t = rebuild_cuda_tensor(
            torch.Tensor, tuple(ints(shape)), tuple(ints(strides)), 0, storage_cls, dt,
            device, handle, storage_bytes - offset, offset, False, REF_COUNTER, 0,
            bytes(64), False)
        host = t.detach().cpu().contiguous()
        raw = bytes(host.reshape(-1).view(torch.uint8).tolist())
        total = float(host.double().sum()) if dt != torch.bool else float(host.sum())
        print("T %s %d %d %.17g %s" % (name, t.device.index, int(t.is_cuda), total, raw.hex()))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
