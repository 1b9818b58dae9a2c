#!/usr/bin/env bash
# The GPU check: what the agent assumes about a real NVIDIA GPU, measured on one.
#
#   tests/gpu/check.sh --prepare     here: build the probe (release, stripped) into target/gpu-check/
#   tests/gpu/check.sh               on a GPU machine: run every part (under 5 minutes in all)
#   tests/gpu/check.sh --dry-run     anywhere: say what each part would do, run nothing on a GPU
#
# Parts, each reported supported / unsupported / failed (never hanging: every step has a timeout
# and the whole run a budget, --budget-s, default 280 s):
#   environment  driver, tools present (nvidia-smi, MPS control, cuda-checkpoint, ptxas, python3)
#   nvml         the agent's own discovery (gshare-gpu-probe nvml): models, memory, UUIDs, MIG mode
#   calibrate    a spin kernel's iterations for ~150 ms on the whole GPU (input to mps)
#   bandwidth    pinned host-to-device copy bandwidth (the executor's swap-in cost), fixed cost
#   mps          MPS control daemon + two CUDA processes with the env the process driver renders
#                for 250 and 750 milli-GPU slices: memory refused past the limit, SM shares hold;
#                a third shows which GPU numbering CUDA_MPS_PINNED_DEVICE_MEM_LIMIT wants
#   checkpoint   cuda-checkpoint (or its driver API) suspends and resumes a process's GPU state
# Output: the log on stdout, one JSON report in $OUT/gpu-check.json (--out DIR; default $OUT,
# else target/gpu-check/out). Without a GPU (no nvidia-smi, no /dev/nvidia0) it does a dry run.
# Exit status: 0 when the check ran (whatever it found) or dry-ran; 2 on bad arguments.
set -u -o pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PROBE_PY="$HERE/cuda_probe.py"
TEMPLATE="$ROOT/configs/examples/runtimes/pytorch.toml"
MODE=auto
BUDGET_S=280
OUTDIR="${OUT:-$ROOT/target/gpu-check/out}"
PROBE="${GSHARE_GPU_PROBE:-}"
# The two MPS clients: slices as the region would place them.
A_MILLI=250 A_MIB=4096
B_MILLI=750 B_MIB=12288
C_MIB=2048

usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; }

while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) MODE=dry-run ;;
    --prepare) MODE=prepare ;;
    --out) OUTDIR="${2:?--out needs a directory}"; shift ;;
    --probe) PROBE="${2:?--probe needs a path}"; shift ;;
    --budget-s) BUDGET_S="${2:?--budget-s needs seconds}"; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "check.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
case "$BUDGET_S" in ''|*[!0-9]*) echo "check.sh: --budget-s takes whole seconds" >&2; exit 2 ;; esac

if [ "$MODE" = prepare ]; then
  cd "$ROOT" || exit 1
  nice -n 10 cargo build --release -q -p gshare-edge --bin gshare-gpu-probe || exit 1
  mkdir -p target/gpu-check
  strip -o target/gpu-check/gshare-gpu-probe target/release/gshare-gpu-probe || exit 1
  echo "probe: target/gpu-check/gshare-gpu-probe ($(stat -c %s target/gpu-check/gshare-gpu-probe) bytes, stripped)"
  echo "run it on the device (docs/ops.md, \"The GPU check\"):"
  echo "  run(command=\"bash tests/gpu/check.sh\", carry=[\"target/gpu-check\"], timeout_s=330)"
  exit 0
fi

if [ -z "$PROBE" ]; then
  for p in "$ROOT/target/gpu-check/gshare-gpu-probe" "$ROOT/target/release/gshare-gpu-probe"; do
    [ -f "$p" ] && [ ! -x "$p" ] && chmod +x "$p" 2>/dev/null  # a carried copy may lose its mode
    if [ -x "$p" ]; then PROBE="$p"; break; fi
  done
fi

if [ "$MODE" = auto ]; then
  if command -v nvidia-smi >/dev/null 2>&1 || [ -e /dev/nvidia0 ]; then
    MODE=run
  else
    MODE=dry-run
    echo "no GPU here (no nvidia-smi, no /dev/nvidia0): dry run"
  fi
fi

mkdir -p "$OUTDIR" || exit 1
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX") || exit 1
START=$(date +%s)
MPS_STARTED=0
cleanup() {
  if [ "$MPS_STARTED" = 1 ]; then
    echo quit | timeout 10 nvidia-cuda-mps-control >/dev/null 2>&1
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say() { printf '%s\n' "$*"; }
# A JSON string of $1 (quotes, backslashes and control characters escaped).
json_str() {
  local s=${1//\\/\\\\}
  s=${s//\"/\\\"}
  s=${s//$'\n'/\\n}
  s=${s//$'\t'/\\t}
  s=${s//$'\r'/}
  printf '"%s"' "$s"
}
part() { # part NAME STATUS REASON [EXTRA-JSON-FIELDS]
  printf '{"status": %s, "reason": %s%s}\n' "$(json_str "$2")" "$(json_str "$3")" "${4:+, $4}" >"$WORK/$1.json"
}
left() { echo $((BUDGET_S - ($(date +%s) - START))); }
# bounded SECONDS CMD...: runs CMD under a timeout no longer than what is left of the budget.
bounded() {
  local want=$1 l
  shift
  l=$(( $(left) - 5 ))
  if [ "$l" -lt "$want" ]; then want=$l; fi
  if [ "$want" -lt 3 ]; then echo "out of the ${BUDGET_S}s budget" >&2; return 124; fi
  timeout -k 5 "$want" "$@"
}
tool() { command -v "$1" 2>/dev/null || echo ""; }
field() { # field FILE KEY: a top-level number or string of the JSON object on FILE's last line
  python3 -c 'import json,sys
d=json.loads([l for l in open(sys.argv[1]).read().splitlines() if l.startswith("{")][-1])
v=d.get(sys.argv[2]); print("" if v is None else v)' "$1" "$2" 2>/dev/null
}

SMI=$(tool nvidia-smi) MPSCTL=$(tool nvidia-cuda-mps-control) CKPT=$(tool cuda-checkpoint)
PTXAS=$(tool ptxas) PY=$(tool python3)

say "== gpu check ($MODE), $(date -u +%FT%TZ), $(uname -srm)"
say "   tools: nvidia-smi=${SMI:-none} mps-control=${MPSCTL:-none} cuda-checkpoint=${CKPT:-none} ptxas=${PTXAS:-none} python3=${PY:-none}"
say "   probe: ${PROBE:-none (build it: tests/gpu/check.sh --prepare)}"
DRIVER=""
if [ "$MODE" = run ] && [ -n "$SMI" ]; then
  DRIVER=$(bounded 20 "$SMI" --query-gpu=driver_version,name,memory.total --format=csv,noheader 2>&1 | head -4)
  say "   nvidia-smi: $DRIVER"
fi
part environment supported "" "\"mode\": $(json_str "$MODE"), \"kernel\": $(json_str "$(uname -srm)"), \"nvidia_smi\": $(json_str "$SMI"), \"mps_control\": $(json_str "$MPSCTL"), \"cuda_checkpoint\": $(json_str "$CKPT"), \"ptxas\": $(json_str "$PTXAS"), \"python3\": $(json_str "$PY"), \"probe\": $(json_str "$PROBE"), \"nvidia_smi_gpus\": $(json_str "$DRIVER")"

# The env the process driver gives each client (same code: ProcessSpec::from_template).
render_env() { # render_env MILLI MIB GPU_MIB [GPU] -> KEY=VALUE lines
  "$PROBE" mps-env --template "$TEMPLATE" --gpus "${4:-0}" --compute-milli "$1" --memory-mib "$2" ${3:+--gpu-memory-mib "$3"}
}

# ---- dry run -----------------------------------------------------------------------------------
if [ "$MODE" = dry-run ]; then
  would() { say "[dry-run] $1: would $2"; part "$1" dry-run "" "\"would\": $(json_str "$2")"; }
  if [ -n "$PROBE" ]; then
    nvml_now=$("$PROBE" nvml 2>&1)
    say "[dry-run] nvml here: $nvml_now"
  fi
  would nvml "run '${PROBE:-gshare-gpu-probe} nvml' (the agent's discover() with backend = nvml, no fallback, plus UUID, MIG and compute mode, PCIe link, one meter reading)"
  would calibrate "run 'cuda_probe.py calibrate': the spin kernel (PTX, driver JIT or ptxas) sized to ~150 ms on all SMs"
  would bandwidth "run 'cuda_probe.py bandwidth': pinned H2D and D2H copies of 1, 16, 256 and 1024 MiB (median of up to 50), pageable 256 MiB, cuMemHostRegister cost; compare with nvml_h2d_mib_per_s = 12000"
  for c in "a $A_MILLI $A_MIB" "b $B_MILLI $B_MIB"; do
    set -- $c
    if [ -n "$PROBE" ]; then
      env_lines=$(render_env "$2" "$3" "" 2>&1 | tr '\n' ' ')
    else
      env_lines="(the probe is not built: tests/gpu/check.sh --prepare)"
    fi
    say "[dry-run] mps client $1 ($2 milli-GPU, $3 MiB) env: $env_lines"
    eval "ENV_$1=\$env_lines"
  done
  would mps "start 'nvidia-cuda-mps-control -d', run client a (${A_MILLI} milli, ${A_MIB} MiB) and b (${B_MILLI} milli, ${B_MIB} MiB) alone (kernel time, SMs of the context, allocate in 256 MiB steps to limit + 1024 MiB) then together for 3 s; client c (a slice on node GPU 1 rendered with mps_ordinals = node, run as device 0, ${C_MIB} MiB) shows which GPU numbering the limit wants; client a env: ${ENV_a}; client b env: ${ENV_b}"
  would checkpoint "run 'cuda_probe.py checkpoint': a process holding 1024 MiB with a pattern, suspended and resumed by ${CKPT:-cuda-checkpoint (none here) or the driver API cuCheckpointProcess*}, pattern verified"
  parts=("$WORK"/environment.json "$WORK"/nvml.json "$WORK"/calibrate.json "$WORK"/bandwidth.json "$WORK"/mps.json "$WORK"/checkpoint.json)
else
# ---- the real run ------------------------------------------------------------------------------
  say "== nvml"
  if [ -z "$PROBE" ]; then
    part nvml failed "gshare-gpu-probe not found: build it here with tests/gpu/check.sh --prepare and carry target/gpu-check"
  else
    bounded 30 "$PROBE" nvml >"$WORK/nvml.json" 2>"$WORK/nvml.err" || part nvml failed "gshare-gpu-probe nvml: exit $? $(tail -c 400 "$WORK/nvml.err")"
  fi
  cat "$WORK/nvml.json"
  GPU_MIB=$(python3 -c 'import json,sys;d=json.load(open(sys.argv[1]));print(d["gpus"][0]["memory_mib"])' "$WORK/nvml.json" 2>/dev/null)

  if [ -z "$PY" ]; then
    for p in calibrate bandwidth mps checkpoint; do part "$p" unsupported "no python3 for cuda_probe.py"; done
  else
    say "== calibrate"
    bounded 60 python3 "$PROBE_PY" calibrate >"$WORK/calibrate.json" 2>"$WORK/calibrate.err" \
      || part calibrate failed "exit $? $(tail -c 400 "$WORK/calibrate.err")"
    cat "$WORK/calibrate.json"
    BLOCKS=$(field "$WORK/calibrate.json" blocks) ITERS=$(field "$WORK/calibrate.json" iters)

    say "== bandwidth"
    bounded 90 python3 "$PROBE_PY" bandwidth >"$WORK/bandwidth.json" 2>"$WORK/bandwidth.err" \
      || part bandwidth failed "exit $? $(tail -c 400 "$WORK/bandwidth.err")"
    cat "$WORK/bandwidth.json"

    say "== mps"
    if [ -z "$MPSCTL" ]; then
      part mps unsupported "nvidia-cuda-mps-control is not on PATH"
    elif [ -z "$PROBE" ]; then
      part mps failed "gshare-gpu-probe not found: the clients' env must come from the process driver's code"
    elif [ -z "$BLOCKS" ] || [ -z "$ITERS" ]; then
      part mps failed "no spin kernel: calibrate did not succeed"
    elif ! render_env "$A_MILLI" "$A_MIB" "$GPU_MIB" >"$WORK/env_a" 2>&1 || ! render_env "$B_MILLI" "$B_MIB" "$GPU_MIB" >"$WORK/env_b" 2>&1 \
        || ! render_env "$A_MILLI" "$C_MIB" "$GPU_MIB" 1 >"$WORK/env_c" 2>&1; then
      part mps failed "rendering the clients' env: $(cat "$WORK/env_a" "$WORK/env_b" "$WORK/env_c" | tail -c 400)"
    else
      say "client a env: $(tr '\n' ' ' <"$WORK/env_a")"
      say "client b env: $(tr '\n' ' ' <"$WORK/env_b")"
      mkdir -p "$WORK/mps-log"
      if CUDA_MPS_LOG_DIRECTORY="$WORK/mps-log" bounded 15 "$MPSCTL" -d >"$WORK/mps-start" 2>&1; then
        MPS_STARTED=1
        client() { # client NAME ENVFILE OUT [extra args]
          local name=$1 envfile=$2 out=$3
          shift 3
          ( set -a; while IFS= read -r kv; do export "$kv"; done <"$envfile"; set +a
            bounded 60 python3 "$PROBE_PY" client --name "$name" --blocks "$BLOCKS" --iters "$ITERS" "$@" ) >"$out" 2>"$out.err" \
            || echo "{\"status\": \"failed\", \"reason\": $(json_str "client $name: exit $? $(tail -c 300 "$out.err")")}" >>"$out"
        }
        client a "$WORK/env_a" "$WORK/solo_a.json" --alloc-cap-mib $((A_MIB + 1024))
        client b "$WORK/env_b" "$WORK/solo_b.json" --alloc-cap-mib $((B_MIB + 1024))
        # Which GPU numbering the limit wants: client c is a slice on node GPU 1 as the default
        # mps_ordinals = "node" renders it (limit keyed 1=), seen by the process as device 0.
        { grep -v '^CUDA_VISIBLE_DEVICES=' "$WORK/env_c"; echo CUDA_VISIBLE_DEVICES=0; } >"$WORK/env_c0"
        client c "$WORK/env_c0" "$WORK/ordinal_c.json" --alloc-cap-mib $((C_MIB + 1024))
        at=$(( $(date +%s) + 4 ))
        client a "$WORK/env_a" "$WORK/shared_a.json" --window-s 3 --start-at "$at" &
        client b "$WORK/env_b" "$WORK/shared_b.json" --window-s 3 --start-at "$at" &
        wait
        servers=$(echo get_server_list | bounded 10 "$MPSCTL" 2>&1)
        for f in solo_a solo_b ordinal_c shared_a shared_b; do say "$f: $(tail -n 1 "$WORK/$f.json")"; done
        bounded 20 python3 "$PROBE_PY" mps-report --solo-a "$WORK/solo_a.json" --solo-b "$WORK/solo_b.json" \
          --shared-a "$WORK/shared_a.json" --shared-b "$WORK/shared_b.json" --ordinal-c "$WORK/ordinal_c.json" --server-list "$servers" >"$WORK/mps.json" 2>"$WORK/mps.err" \
          || part mps failed "mps-report: exit $? $(tail -c 400 "$WORK/mps.err")"
        echo quit | bounded 10 "$MPSCTL" >/dev/null 2>&1 && MPS_STARTED=0
      else
        part mps unsupported "nvidia-cuda-mps-control -d failed: $(tail -c 400 "$WORK/mps-start")"
      fi
    fi
    tail -n 1 "$WORK/mps.json"

    say "== checkpoint"
    bounded 100 python3 "$PROBE_PY" checkpoint --tool "$CKPT" --deadline-s 90 >"$WORK/checkpoint.json" 2>"$WORK/checkpoint.err" \
      || part checkpoint failed "exit $? $(tail -c 400 "$WORK/checkpoint.err")"
    cat "$WORK/checkpoint.json"
  fi
  parts=("$WORK"/environment.json "$WORK"/nvml.json "$WORK"/calibrate.json "$WORK"/bandwidth.json "$WORK"/mps.json "$WORK"/checkpoint.json)
fi

# ---- report ------------------------------------------------------------------------------------
for p in "${parts[@]}"; do
  [ -s "$p" ] || part "$(basename "$p" .json)" failed "no output"
done
say "== summary (${MODE}, $(( $(date +%s) - START ))s)"
if [ -n "$PY" ]; then
  python3 "$PROBE_PY" summary --mode "$MODE" --out "$OUTDIR/gpu-check.json" "${parts[@]}"
else
  { printf '{"mode": %s, "parts": {' "$(json_str "$MODE")"; sep=""
    for p in "${parts[@]}"; do printf '%s%s: %s' "$sep" "$(json_str "$(basename "$p" .json)")" "$(tail -n 1 "$p")"; sep=", "; done
    printf '}}\n'; } >"$OUTDIR/gpu-check.json"
  for p in "${parts[@]}"; do say "$(basename "$p" .json): $(tail -n 1 "$p")"; done
fi
if [ "$MODE" = run ]; then
  h2d=$(field "$WORK/bandwidth.json" h2d_mib_per_s) fixed=$(field "$WORK/bandwidth.json" copy_fixed_us)
  if [ -n "$h2d" ]; then
    say "executor: nvml_h2d_mib_per_s = $(( h2d / 500 * 500 )) (measured ${h2d} MiB/s pinned H2D of 1 GiB; default 12000)"
    say "executor: a copy's fixed cost ${fixed} us (swap_setup_us default 2000 also covers allocation and pinning)"
  fi
fi
say "report: $OUTDIR/gpu-check.json"
exit 0
