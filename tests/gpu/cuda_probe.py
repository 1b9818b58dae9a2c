#!/usr/bin/env python3
"""CUDA probes for tests/gpu/check.sh, through the CUDA driver API (libcuda) and ctypes alone.

No PyTorch, no nvcc needed: the one kernel (a dependent-FMA spin loop) is PTX text the driver
compiles; where the driver's JIT is missing, `ptxas` (if on PATH) assembles it instead.
Every subcommand prints one JSON object on its last stdout line and exits 0 when it could say
something (its "status" says supported / unsupported / failed); check.sh bounds each with a timeout.

  calibrate       spin-kernel iterations for a target time on the whole GPU
  bandwidth       pinned and pageable host<->device copy bandwidth, pinning cost
  client          one MPS client: SMs it was given, memory limit, kernel time, shared window
  checkpoint      suspend and resume a CUDA process's GPU state (cuda-checkpoint or the driver API)
  checkpoint-target   (internal) the process `checkpoint` suspends
  summary         merge the parts' JSON files into one report
"""

import argparse
import ctypes
import json
import mmap
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

MIB = 1 << 20

PTX = r"""
.version 7.0
.target sm_75
.address_size 64

.visible .entry gshare_spin(
	.param .u64 gshare_spin_out,
	.param .u32 gshare_spin_iters
)
{
	.reg .pred %p<2>;
	.reg .b32 %r<8>;
	.reg .f32 %f<4>;
	.reg .b64 %rd<4>;

	ld.param.u64 %rd1, [gshare_spin_out];
	ld.param.u32 %r1, [gshare_spin_iters];
	mov.u32 %r2, %ctaid.x;
	mov.u32 %r3, %ntid.x;
	mov.u32 %r4, %tid.x;
	mad.lo.u32 %r5, %r2, %r3, %r4;
	cvt.rn.f32.u32 %f1, %r5;
	mov.f32 %f2, 0f3F800000;
	mov.u32 %r6, 0;
$L_loop:
	fma.rn.f32 %f1, %f1, 0f3F7FFFEF, %f2;
	add.u32 %r6, %r6, 1;
	setp.lt.u32 %p1, %r6, %r1;
	@%p1 bra $L_loop;
	cvta.to.global.u64 %rd2, %rd1;
	mul.wide.u32 %rd3, %r5, 4;
	add.u64 %rd2, %rd2, %rd3;
	st.global.f32 [%rd2], %f1;
	ret;
}
"""

THREADS = 256
CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
CU_EXEC_AFFINITY_TYPE_SM_COUNT = 0
CUDA_ERROR_OUT_OF_MEMORY = 2
PROCESS_STATES = {0: "running", 1: "locked", 2: "checkpointed", 3: "failed"}


class CudaError(Exception):
    def __init__(self, call, code, name):
        super().__init__(f"{call}: {name} ({code})")
        self.call = call
        self.code = code
        self.name = name


class Cuda:
    """The few driver-API calls the probes make."""

    def __init__(self):
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.check("cuInit", self.lib.cuInit(0))

    def has(self, symbol):
        return hasattr(self.lib, symbol)

    def error_name(self, code):
        p = ctypes.c_char_p()
        if self.lib.cuGetErrorName(code, ctypes.byref(p)) == 0 and p.value:
            return p.value.decode()
        return f"CUresult {code}"

    def check(self, call, code):
        if code != 0:
            raise CudaError(call, code, self.error_name(code))

    def call(self, name, *args):
        self.check(name, getattr(self.lib, name)(*args))


class Context:
    """The primary context of device 0 made current (what a runtime's framework does)."""

    def __init__(self, cuda):
        self.cuda = cuda
        self.dev = ctypes.c_int()
        cuda.call("cuDeviceGet", ctypes.byref(self.dev), 0)
        self.ctx = ctypes.c_void_p()
        cuda.call("cuDevicePrimaryCtxRetain", ctypes.byref(self.ctx), self.dev)
        cuda.call("cuCtxSetCurrent", self.ctx)

    def attribute(self, attr):
        v = ctypes.c_int()
        self.cuda.call("cuDeviceGetAttribute", ctypes.byref(v), attr, self.dev)
        return v.value

    def name(self):
        buf = ctypes.create_string_buffer(256)
        self.cuda.call("cuDeviceGetName", buf, 256, self.dev)
        return buf.value.decode()

    def mem_info(self):
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        self.cuda.call("cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(total))
        return {"free_mib": free.value // MIB, "total_mib": total.value // MIB}

    def sm_affinity(self):
        """SMs this context may use (MPS's active thread percentage shows here)."""
        if not self.cuda.has("cuCtxGetExecAffinity"):
            return None
        param = (ctypes.c_uint * 2)()
        code = self.cuda.lib.cuCtxGetExecAffinity(param, CU_EXEC_AFFINITY_TYPE_SM_COUNT)
        return param[1] if code == 0 else None

    def sync(self):
        self.cuda.call("cuCtxSynchronize")

    def alloc(self, nbytes):
        p = ctypes.c_uint64()
        self.cuda.call("cuMemAlloc_v2", ctypes.byref(p), ctypes.c_size_t(nbytes))
        return p.value

    def free(self, p):
        self.cuda.call("cuMemFree_v2", ctypes.c_uint64(p))


def load_spin(ctx):
    """The spin kernel: PTX through the driver's JIT, else through `ptxas`."""
    cuda = ctx.cuda
    module = ctypes.c_void_p()
    code = cuda.lib.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(PTX.encode()))
    how = "driver JIT"
    if code != 0:
        first = cuda.error_name(code)
        ptxas = shutil.which("ptxas")
        if not ptxas:
            raise CudaError("cuModuleLoadData", code, first + "; no ptxas on PATH to assemble instead")
        cc = ctx.attribute(75) * 10 + ctx.attribute(76)  # compute capability major, minor
        with tempfile.TemporaryDirectory() as d:
            src, out = os.path.join(d, "spin.ptx"), os.path.join(d, "spin.cubin")
            with open(src, "w") as f:
                f.write(PTX)
            subprocess.run([ptxas, f"-arch=sm_{cc}", src, "-o", out], check=True, timeout=60)
            with open(out, "rb") as f:
                image = f.read()
        cuda.call("cuModuleLoadData", ctypes.byref(module), ctypes.c_char_p(image))
        how = f"ptxas sm_{cc} (driver JIT: {first})"
    fn = ctypes.c_void_p()
    cuda.call("cuModuleGetFunction", ctypes.byref(fn), module, b"gshare_spin")
    return fn, how


class Spin:
    def __init__(self, ctx, blocks):
        self.ctx = ctx
        self.fn, self.how = load_spin(ctx)
        self.blocks = blocks
        self.out = ctx.alloc(blocks * THREADS * 4)

    def launch(self, iters):
        out = ctypes.c_uint64(self.out)
        n = ctypes.c_uint32(iters)
        params = (ctypes.c_void_p * 2)(ctypes.addressof(out), ctypes.addressof(n))
        self.ctx.cuda.call(
            "cuLaunchKernel", self.fn, self.blocks, 1, 1, THREADS, 1, 1, 0, None, params, None
        )

    def time_s(self, iters, reps=3):
        self.launch(iters)
        self.ctx.sync()
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            self.launch(iters)
            self.ctx.sync()
            times.append(time.perf_counter() - t)
        return min(times)


def emit(obj):
    print(json.dumps(obj, sort_keys=True), flush=True)


def failure(e):
    return {"status": "failed", "reason": str(e)}


def guarded(fn):
    """Runs a probe; a missing libcuda is `unsupported`, any other error `failed`."""
    try:
        emit(fn())
    except OSError as e:
        emit({"status": "unsupported", "reason": f"no CUDA driver library: {e}"})
    except CudaError as e:
        status = "unsupported" if e.code in (100, 999, 34) else "failed"  # no device, unknown, stub
        emit({"status": status, "reason": str(e)})
    except Exception as e:  # noqa: BLE001 - the report must say what broke, not crash
        emit(failure(f"{type(e).__name__}: {e}"))


# ---- calibrate ---------------------------------------------------------------------------------


def calibrate(args):
    cuda = Cuda()
    ctx = Context(cuda)
    sms = ctx.attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
    # 8 resident blocks of 256 threads per SM, many waves, so that a share of the SMs is a share
    # of the time with little tail.
    blocks = sms * 8 * args.waves
    spin = Spin(ctx, blocks)
    iters, t = 1000, spin.time_s(1000, reps=1)
    while t < args.target_ms / 1000 / 4 and iters < 1 << 30:
        iters *= 4
        t = spin.time_s(iters, reps=1)
    iters = min(0xFFFFFFFF, max(1, int(iters * (args.target_ms / 1000) / max(t, 1e-6))))
    t = spin.time_s(iters)
    return {
        "status": "supported",
        "device": ctx.name(),
        "sm_count": sms,
        "blocks": blocks,
        "threads": THREADS,
        "iters": iters,
        "kernel_ms": round(t * 1000, 3),
        "kernel_from": spin.how,
    }


# ---- bandwidth ---------------------------------------------------------------------------------


def copy_times(ctx, fn, dst, src, nbytes, reps):
    fn_ = getattr(ctx.cuda.lib, fn)
    ctx.cuda.check(fn, fn_(dst, src, ctypes.c_size_t(nbytes)))
    ctx.sync()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        ctx.cuda.check(fn, fn_(dst, src, ctypes.c_size_t(nbytes)))
        ctx.sync()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def bandwidth(args):
    cuda = Cuda()
    ctx = Context(cuda)
    sizes = [int(s) for s in args.sizes_mib.split(",")]
    big = max(sizes)
    host = ctypes.c_void_p()
    cuda.call("cuMemHostAlloc", ctypes.byref(host), ctypes.c_size_t(big * MIB), 0)
    ctypes.memset(host, 0x5A, big * MIB)
    dev = ctx.alloc(big * MIB)
    rows = []
    for mib in sizes:
        reps = max(3, min(50, 4096 // max(mib, 1)))
        h2d = copy_times(ctx, "cuMemcpyHtoD_v2", ctypes.c_uint64(dev), host, mib * MIB, reps)
        d2h = copy_times(ctx, "cuMemcpyDtoH_v2", host, ctypes.c_uint64(dev), mib * MIB, reps)
        rows.append(
            {
                "mib": mib,
                "reps": reps,
                "h2d_us": round(h2d * 1e6, 1),
                "h2d_mib_per_s": round(mib / h2d),
                "d2h_us": round(d2h * 1e6, 1),
                "d2h_mib_per_s": round(mib / d2h),
            }
        )
    # Pageable memory: what a runtime that does not pin its host copy gets, and what pinning
    # such memory costs (cuMemHostRegister), per GiB.
    pmib = min(big, args.pageable_mib)
    page = mmap.mmap(-1, pmib * MIB)
    page.write(b"\x5a" * (pmib * MIB))
    paddr = ctypes.c_void_p(ctypes.addressof(ctypes.c_char.from_buffer(page)))
    pageable = copy_times(ctx, "cuMemcpyHtoD_v2", ctypes.c_uint64(dev), paddr, pmib * MIB, 5)
    t = time.perf_counter()
    cuda.call("cuMemHostRegister_v2", paddr, ctypes.c_size_t(pmib * MIB), 0)
    register_s = time.perf_counter() - t
    registered = copy_times(ctx, "cuMemcpyHtoD_v2", ctypes.c_uint64(dev), paddr, pmib * MIB, 5)
    cuda.call("cuMemHostUnregister", paddr)
    del paddr
    ctx.free(dev)
    cuda.call("cuMemFreeHost", host)
    largest = rows[-1] if rows[-1]["mib"] == big else max(rows, key=lambda r: r["mib"])
    smallest = min(rows, key=lambda r: r["mib"])
    # A copy of W MiB takes setup + W / bandwidth: the executor's swap model. The fixed part is
    # the smallest copy's time less its bytes at the large-copy bandwidth.
    fixed_us = smallest["h2d_us"] - smallest["mib"] / largest["h2d_mib_per_s"] * 1e6
    return {
        "status": "supported",
        "device": ctx.name(),
        "pinned": rows,
        "h2d_mib_per_s": largest["h2d_mib_per_s"],
        "d2h_mib_per_s": largest["d2h_mib_per_s"],
        "copy_fixed_us": round(max(fixed_us, 0.0), 1),
        "pageable": {
            "mib": pmib,
            "h2d_mib_per_s": round(pmib / pageable),
            "register_ms_per_gib": round(register_s * 1000 * 1024 / pmib, 2),
            "registered_h2d_mib_per_s": round(pmib / registered),
        },
    }


# ---- one MPS client ----------------------------------------------------------------------------


def parse_limit_mib(env, ordinal):
    """`0=4096M,1=2G` -> MiB for `ordinal` (the process driver writes `<n>=<MiB>M`)."""
    for part in env.split(","):
        k, _, v = part.partition("=")
        if k.strip() == str(ordinal) and v:
            unit = v[-1].upper()
            n = int(v[:-1]) if unit in "KMG" else int(v)
            return {"K": n / 1024, "M": n, "G": n * 1024}.get(unit, n / MIB)
    return None


def client(args):
    cuda = Cuda()
    ctx = Context(cuda)
    env_limit = os.environ.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
    limit_mib = parse_limit_mib(env_limit, visible) if env_limit else None
    if limit_mib is None and env_limit:
        limit_mib = parse_limit_mib(env_limit, 0)
    out = {
        "status": "supported",
        "name": args.name,
        "pid": os.getpid(),
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(("CUDA_", "GSHARE_"))},
        "sm_count_device": ctx.attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
        "sm_count_context": ctx.sm_affinity(),
        "mem_info": ctx.mem_info(),
        "limit_mib": limit_mib,
    }
    spin = Spin(ctx, args.blocks)
    if args.window_s > 0:
        # Wait for the shared start, then launch back to back for the window.
        spin.launch(1)
        ctx.sync()
        while time.time() < args.start_at:
            time.sleep(0.002)
        t0 = time.perf_counter()
        n = 0
        while time.perf_counter() - t0 < args.window_s:
            spin.launch(args.iters)
            ctx.sync()
            n += 1
        elapsed = time.perf_counter() - t0
        out["window"] = {"kernels": n, "seconds": round(elapsed, 3), "kernels_per_s": round(n / elapsed, 3)}
    else:
        t = spin.time_s(args.iters)
        out["kernel_ms"] = round(t * 1000, 3)
        out["kernels_per_s"] = round(1 / t, 3)
    if args.alloc_cap_mib > 0:
        out["alloc"] = allocate_until_refused(ctx, args.chunk_mib, args.alloc_cap_mib)
    return out


def allocate_until_refused(ctx, chunk_mib, cap_mib):
    """Allocates `chunk_mib` pieces until the driver refuses or `cap_mib` is held."""
    held, total = [], 0
    refused = None
    while total + chunk_mib <= cap_mib:
        try:
            held.append(ctx.alloc(chunk_mib * MIB))
            total += chunk_mib
        except CudaError as e:
            refused = e.name
            break
    # A last, finer step shows how close to the limit the refusal came.
    fine = 0
    if refused:
        step = max(1, chunk_mib // 8)
        while fine + step < chunk_mib:
            try:
                held.append(ctx.alloc(step * MIB))
                fine += step
            except CudaError:
                break
    for p in held:
        ctx.free(p)
    return {"allocated_mib": total + fine, "refused_with": refused, "cap_mib": cap_mib, "chunk_mib": chunk_mib}


# ---- checkpoint --------------------------------------------------------------------------------

PATTERN = 0x6A5E0C0F


def checkpoint_target(args):
    """Holds `--mib` of device memory filled with a pattern; on `verify` reads it back."""
    signal.alarm(args.deadline_s)  # never outlive the check
    cuda = Cuda()
    ctx = Context(cuda)
    nbytes = args.mib * MIB
    dev = ctx.alloc(nbytes)
    cuda.call("cuMemsetD32_v2", ctypes.c_uint64(dev), ctypes.c_uint(PATTERN), ctypes.c_size_t(nbytes // 4))
    ctx.sync()
    print(json.dumps({"ready": os.getpid()}), flush=True)
    line = sys.stdin.readline().strip()
    if line != "verify":
        return {"status": "failed", "reason": f"target got {line!r}, not verify"}
    host = (ctypes.c_uint32 * (nbytes // 4))()
    cuda.call("cuMemcpyDtoH_v2", host, ctypes.c_uint64(dev), ctypes.c_size_t(nbytes))
    bad = sum(1 for i in range(0, nbytes // 4, 4096) if host[i] != PATTERN)
    return {"status": "supported" if bad == 0 else "failed", "sampled_words_wrong": bad, "mib": args.mib}


def gpu_memory_used_mib():
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        r = subprocess.run(
            [smi, "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
            capture_output=True, text=True, timeout=15,
        )
        return int(r.stdout.split()[0]) if r.returncode == 0 and r.stdout.strip() else None
    except (subprocess.TimeoutExpired, ValueError, IndexError):
        return None


class Checkpointer:
    """Suspends and resumes a process's GPU state: the `cuda-checkpoint` tool if there is one,
    else the driver API it is built on (cuCheckpointProcess*, driver >= 570)."""

    def __init__(self, tool):
        self.tool = tool
        self.cuda = None if tool else Cuda()
        if self.cuda and not self.cuda.has("cuCheckpointProcessLock"):
            raise CudaError("cuCheckpointProcessLock", -1, "not in this driver's libcuda")

    def how(self):
        return f"cuda-checkpoint ({self.tool})" if self.tool else "driver API cuCheckpointProcess*"

    def run_tool(self, *args):
        r = subprocess.run([self.tool, *args], capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            raise RuntimeError(f"cuda-checkpoint {' '.join(args)}: exit {r.returncode}: {(r.stderr or r.stdout).strip()}")
        return r.stdout.strip()

    def state(self, pid):
        if self.tool:
            return self.run_tool("--get-state", "--pid", str(pid))
        s = ctypes.c_int()
        self.cuda.call("cuCheckpointProcessGetState", ctypes.c_int(pid), ctypes.byref(s))
        return PROCESS_STATES.get(s.value, str(s.value))

    def suspend(self, pid):
        if self.tool:
            self.run_tool("--toggle", "--pid", str(pid))
            return
        self.cuda.call("cuCheckpointProcessLock", ctypes.c_int(pid), None)
        self.cuda.call("cuCheckpointProcessCheckpoint", ctypes.c_int(pid), None)

    def resume(self, pid):
        if self.tool:
            self.run_tool("--toggle", "--pid", str(pid))
            return
        self.cuda.call("cuCheckpointProcessRestore", ctypes.c_int(pid), None)
        self.cuda.call("cuCheckpointProcessUnlock", ctypes.c_int(pid), None)


def checkpoint(args):
    tool = args.tool or shutil.which("cuda-checkpoint")
    out = {"tool": tool, "mib": args.mib}
    try:
        ck = Checkpointer(tool)
    except (OSError, CudaError) as e:
        out.update(status="unsupported", reason=f"no cuda-checkpoint on PATH and {e}")
        return out
    out["via"] = ck.how()
    target = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "checkpoint-target", "--mib", str(args.mib),
         "--deadline-s", str(args.deadline_s)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        ready = json.loads(target.stdout.readline() or "{}")
        pid = ready.get("ready")
        if not pid:
            out.update(status="failed", reason=f"target did not start: {ready}")
            return out
        out["memory_used_mib_running"] = gpu_memory_used_mib()
        out["state_before"] = ck.state(pid)
        t = time.perf_counter()
        ck.suspend(pid)
        out["suspend_ms"] = round((time.perf_counter() - t) * 1000, 1)
        out["state_suspended"] = ck.state(pid)
        out["memory_used_mib_suspended"] = gpu_memory_used_mib()
        t = time.perf_counter()
        ck.resume(pid)
        out["resume_ms"] = round((time.perf_counter() - t) * 1000, 1)
        out["state_after"] = ck.state(pid)
        running, suspended = out["memory_used_mib_running"], out["memory_used_mib_suspended"]
        if running is not None and suspended is not None:
            out["memory_released_mib"] = running - suspended
        target.stdin.write("verify\n")
        target.stdin.flush()
        lines = target.stdout.read().strip().splitlines()
        target.wait(timeout=30)
        out["target"] = json.loads(lines[-1]) if lines else {"status": "failed", "reason": "no output"}
        ok = out["target"].get("status") == "supported"
        out["status"] = "supported" if ok else "failed"
        if not ok:
            out["reason"] = "the process's GPU memory did not come back intact"
        return out
    except Exception as e:  # noqa: BLE001
        out.update(status="failed", reason=f"{type(e).__name__}: {e}")
        return out
    finally:
        if target.poll() is None:
            target.kill()
            target.wait()


# ---- the MPS verdict ---------------------------------------------------------------------------


def last_json(path):
    try:
        with open(path) as f:
            lines = [ln for ln in f.read().splitlines() if ln.strip().startswith("{")]
        return json.loads(lines[-1]) if lines else {"status": "failed", "reason": f"{path}: no output"}
    except (OSError, ValueError) as e:
        return {"status": "failed", "reason": f"{path}: {e}"}


def mps_report(args):
    """Judges the four client runs: memory limits refuse past the limit, compute shares hold."""
    runs = {n: last_json(p) for n, p in (("solo_a", args.solo_a), ("solo_b", args.solo_b),
                                         ("shared_a", args.shared_a), ("shared_b", args.shared_b))}
    out = {"runs": runs, "server_list": args.server_list.strip()}
    broken = [f"{n}: {r.get('reason')}" for n, r in runs.items() if r.get("status") != "supported"]
    if broken:
        out.update(status="failed", reason="; ".join(broken))
        return out
    problems = []
    memory = {}
    for n in ("solo_a", "solo_b"):
        r = runs[n]
        a, limit = r.get("alloc", {}), r.get("limit_mib")
        got = a.get("allocated_mib", 0)
        enforced = limit is not None and a.get("refused_with") == "CUDA_ERROR_OUT_OF_MEMORY" and got <= limit
        memory[n] = {"limit_mib": limit, "allocated_mib": got, "refused_with": a.get("refused_with"),
                     "mem_info_total_mib": r["mem_info"]["total_mib"], "enforced": enforced}
        if not enforced:
            problems.append(f"{n}: allocated {got} MiB against a limit of {limit} MiB ({a.get('refused_with') or 'never refused'})")
    out["memory"] = memory
    a, b = runs["solo_a"], runs["solo_b"]
    sms = a["sm_count_device"]
    pct = lambda r: int(r["env"].get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "100"))  # noqa: E731
    compute = {
        "sm_count_device": sms,
        "a": {"percent": pct(a), "sm_count_context": a["sm_count_context"], "kernel_ms": a["kernel_ms"],
              "shared_kernels_per_s": runs["shared_a"]["window"]["kernels_per_s"], "solo_kernels_per_s": a["kernels_per_s"]},
        "b": {"percent": pct(b), "sm_count_context": b["sm_count_context"], "kernel_ms": b["kernel_ms"],
              "shared_kernels_per_s": runs["shared_b"]["window"]["kernels_per_s"], "solo_kernels_per_s": b["kernels_per_s"]},
    }
    # A share holds when (1) the context is given about its percentage of the SMs, (2) the same
    # work takes about as much longer as it has fewer SMs, and (3) running beside the other
    # client costs it little (the shares add up to 100 %, so neither should slow the other).
    for side in ("a", "b"):
        c = compute[side]
        want = sms * c["percent"] / 100
        if c["sm_count_context"] is None or not (0.75 * want <= c["sm_count_context"] <= 1.25 * want + 2):
            problems.append(f"{side}: context has {c['sm_count_context']} SMs for {c['percent']} % of {sms}")
        c["shared_over_solo"] = round(c["shared_kernels_per_s"] / c["solo_kernels_per_s"], 3)
        if c["shared_over_solo"] < 0.75:
            problems.append(f"{side}: beside the other client it ran at {c['shared_over_solo']} of its solo rate")
    if a["sm_count_context"] and b["sm_count_context"]:
        expected = b["sm_count_context"] / a["sm_count_context"]
        measured = a["kernel_ms"] / b["kernel_ms"]
        compute["time_ratio_a_over_b"] = round(measured, 3)
        compute["sm_ratio_b_over_a"] = round(expected, 3)
        if not (0.7 * expected <= measured <= 1.3 * expected):
            problems.append(f"kernel time ratio {measured:.2f} against an SM ratio of {expected:.2f}")
    out["compute"] = compute
    if args.ordinal_c:
        # Client c: CUDA_VISIBLE_DEVICES=0 but the limit keyed `1=` (what mps_ordinals = "node"
        # writes for a slice on node GPU 1, which the process sees as device 0).
        c = last_json(args.ordinal_c)
        a = c.get("alloc", {})
        key_limit = parse_limit_mib(c.get("env", {}).get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", ""), 1)
        out["ordinals"] = {
            "env": c.get("env"),
            "allocated_mib": a.get("allocated_mib"),
            "refused_with": a.get("refused_with"),
            "node_key_honoured": bool(key_limit and a.get("refused_with") and a.get("allocated_mib", 0) <= key_limit),
            "status": c.get("status"),
            "reason": c.get("reason"),
        }
    if problems:
        out.update(status="failed", reason="; ".join(problems))
    else:
        out["status"] = "supported"
    return out


# ---- summary -----------------------------------------------------------------------------------


def summary(args):
    parts = {}
    for path in args.parts:
        parts[os.path.splitext(os.path.basename(path))[0]] = last_json(path)
    report = {"mode": args.mode, "parts": parts}
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2, sort_keys=True)
        f.write("\n")
    for name, p in parts.items():
        print(f"{name}: {p.get('status', '?')}" + (f" ({p['reason']})" if p.get("reason") else ""))
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("calibrate")
    c.add_argument("--target-ms", type=float, default=150)
    c.add_argument("--waves", type=int, default=12)
    b = sub.add_parser("bandwidth")
    b.add_argument("--sizes-mib", default="1,16,256,1024")
    b.add_argument("--pageable-mib", type=int, default=256)
    m = sub.add_parser("client")
    m.add_argument("--name", required=True)
    m.add_argument("--blocks", type=int, required=True)
    m.add_argument("--iters", type=int, required=True)
    m.add_argument("--window-s", type=float, default=0)
    m.add_argument("--start-at", type=float, default=0)
    m.add_argument("--alloc-cap-mib", type=int, default=0)
    m.add_argument("--chunk-mib", type=int, default=256)
    k = sub.add_parser("checkpoint")
    k.add_argument("--tool", default="")
    k.add_argument("--mib", type=int, default=1024)
    k.add_argument("--deadline-s", type=int, default=90)
    t = sub.add_parser("checkpoint-target")
    t.add_argument("--mib", type=int, required=True)
    t.add_argument("--deadline-s", type=int, default=90)
    r = sub.add_parser("mps-report")
    for side in ("solo-a", "solo-b", "shared-a", "shared-b"):
        r.add_argument(f"--{side}", required=True)
    r.add_argument("--server-list", default="")
    r.add_argument("--ordinal-c", default="")
    s = sub.add_parser("summary")
    s.add_argument("--mode", required=True)
    s.add_argument("--out", required=True)
    s.add_argument("parts", nargs="+")
    args = ap.parse_args()
    if args.cmd == "summary":
        summary(args)
        return
    fn = {
        "calibrate": calibrate,
        "bandwidth": bandwidth,
        "client": client,
        "checkpoint": checkpoint,
        "checkpoint-target": checkpoint_target,
        "mps-report": mps_report,
    }[args.cmd]
    guarded(lambda: fn(args))


if __name__ == "__main__":
    main()
