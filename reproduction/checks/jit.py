"""`--jit-smoke`: compile and run one real kernel on the selected device, in a subprocess under a timeout.

CUDA: a Triton vector-add compiled with a fresh, node-local TRITON_CACHE_DIR (a new folder under the
system temp dir, removed afterwards), so the reported time is a cold compile. Ascend: a one-process
`hccl` group doing one all_reduce plus one NPU op (torch_npu imported explicitly, autoload off). CPU:
nothing to compile; the row says what was skipped and why.
"""

from __future__ import annotations

import json
import socket
import tempfile
from typing import Any

from reproduction.checks.context import CheckContext
from reproduction.checks.probe import ACCELERATOR, TOOLCHAIN, ProbeResult, fail, ok, python_script_argv, skip

TRITON_TIMEOUT_S = 300.0
HCCL_TIMEOUT_S = 120.0

TRITON_SCRIPT = r"""# portable-probe: triton-vector-add
import json, time
out = {}
try:
    import torch, triton, triton.language as tl
    out["triton"] = triton.__version__
    @triton.jit
    def add_kernel(x_ptr, y_ptr, o_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(o_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)
    n = 98432
    x = torch.rand(n, device="cuda"); y = torch.rand(n, device="cuda"); o = torch.empty_like(x)
    start = time.perf_counter()
    try:
        add_kernel[(triton.cdiv(n, 1024),)](x, y, o, n, BLOCK=1024)
        torch.cuda.synchronize()
    except Exception as exc:
        out["stage"] = "compile"
        raise
    out["compile_s"] = time.perf_counter() - start
    start = time.perf_counter()
    add_kernel[(triton.cdiv(n, 1024),)](x, y, o, n, BLOCK=1024); torch.cuda.synchronize()
    out["warm_s"] = time.perf_counter() - start
    out["max_abs_error"] = float((o - (x + y)).abs().max())
except BaseException as exc:
    out.setdefault("stage", "setup")
    out["error"] = "%s: %s" % (type(exc).__name__, str(exc)[-600:])
print(json.dumps(out))
"""

HCCL_SCRIPT = r"""# portable-probe: hccl-all-reduce
import json, os, sys, time
os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
out = {}
try:
    import torch, torch_npu  # explicit; never torch_npu.contrib.transfer_to_npu
    import torch.distributed as dist
    torch.npu.set_device(0)
    start = time.perf_counter()
    dist.init_process_group("hccl", init_method="tcp://127.0.0.1:%s" % sys.argv[1], rank=0, world_size=1)
    t = torch.full((1024,), 2.0, device="npu")
    dist.all_reduce(t)
    value = float((t * 3).sum().item())  # one NPU op after the collective
    out["seconds"] = time.perf_counter() - start
    out["value"] = value
    dist.barrier()
    dist.destroy_process_group()
except BaseException as exc:
    out["error"] = "%s: %s" % (type(exc).__name__, str(exc)[-600:])
print(json.dumps(out))
"""


def _last_json(stdout: str) -> dict[str, Any] | None:
    try:
        return json.loads(stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def probe_jit(ctx: CheckContext, selected: str) -> ProbeResult:
    """The `jit` row for the selected device (cuda: Triton; npu: hccl; cpu: skipped, saying why)."""
    if selected == "cuda":
        return triton_smoke(ctx)
    if selected == "npu":
        return hccl_smoke(ctx)
    return skip(
        "jit",
        "skipped on CPU: the Triton vector-add needs a CUDA GPU and the hccl all_reduce an Ascend NPU; "
        "the C compiler Triton would use was checked by the toolchain probe",
        skipped=["triton-vector-add", "hccl-all-reduce"],
        device=selected,
    )


def triton_smoke(ctx: CheckContext) -> ProbeResult:
    if not ctx.module("triton"):
        return fail(
            "jit",
            TOOLCHAIN,
            f"triton is not installed in {ctx.python}",
            "install the triton the bundle pins (restore the runtime)",
        )
    with tempfile.TemporaryDirectory(prefix="portable-triton-cache-") as cache:
        env = dict(ctx.env, TRITON_CACHE_DIR=cache)
        result = ctx.run(python_script_argv(ctx.python, TRITON_SCRIPT), timeout=TRITON_TIMEOUT_S, env=env)
    info = _last_json(result.stdout) or {}
    details = {**info, "cache_dir": "fresh temporary folder (removed)", "exit": result.returncode}
    if result.timed_out:
        return fail(
            "jit",
            TOOLCHAIN,
            f"Triton vector-add did not finish in {TRITON_TIMEOUT_S:.0f} s (compile hung)",
            "check TRITON_CACHE_DIR/home cache filesystems (fs rows) and the CUDA toolkit's ptxas",
            **details,
        )
    if not info or info.get("error"):
        stage = info.get("stage", "setup")
        failure = TOOLCHAIN if stage == "compile" else ACCELERATOR
        return fail(
            "jit",
            failure,
            f"Triton vector-add failed at {stage}: {info.get('error') or result.tail()}",
            "see the toolchain row (Python.h, CC); then the CUDA rows",
            **details,
        )
    if info.get("max_abs_error", 1.0) > 1e-6:
        return fail(
            "jit",
            ACCELERATOR,
            f"Triton vector-add gave wrong results (max error {info['max_abs_error']:.3g})",
            "the GPU or driver is faulty: check nvidia-smi -q for ECC errors",
            **details,
        )
    return ok(
        "jit",
        f"Triton {info.get('triton')} vector-add: cold compile + run {info['compile_s']:.2f} s, "
        f"warm {info['warm_s'] * 1e3:.1f} ms, exact",
        **details,
    )


def hccl_smoke(ctx: CheckContext) -> ProbeResult:
    if not ctx.module("torch_npu"):
        return fail(
            "jit",
            ACCELERATOR,
            f"torch_npu is not installed in {ctx.python}",
            "install torch_npu matching torch and CANN",
        )
    env = dict(ctx.env, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    argv = [*python_script_argv(ctx.python, HCCL_SCRIPT), str(_free_port())]
    result = ctx.run(argv, timeout=HCCL_TIMEOUT_S, env=env)
    info = _last_json(result.stdout) or {}
    details = {**info, "exit": result.returncode}
    if result.timed_out:
        return fail(
            "jit",
            ACCELERATOR,
            f"hccl all_reduce did not finish in {HCCL_TIMEOUT_S:.0f} s",
            "check HCCL_* settings, the NPU's network (hccn_tool) and that no other job holds the NPU",
            **details,
        )
    if not info or info.get("error"):
        return fail(
            "jit",
            ACCELERATOR,
            f"hccl all_reduce failed: {info.get('error') or result.tail()}",
            "source CANN's set_env.sh (libhccl.so) and check the npu rows",
            **details,
        )
    if abs(info.get("value", 0.0) - 6144.0) > 1e-3:
        return fail(
            "jit",
            ACCELERATOR,
            f"hccl all_reduce + NPU op gave {info.get('value')} instead of 6144.0",
            "the NPU or CANN install is faulty",
            **details,
        )
    return ok("jit", f"hccl all_reduce (1 process) + one NPU op in {info['seconds']:.2f} s, correct", **details)
