#!/usr/bin/env bash
# The CUDA path of elastic-ring, measured in one command (under 10 minutes on one GPU node, the
# Horovod build of --kit included):
#
#   scripts/gpu_check.sh [--device cuda|cpu] [--out FILE] [--python PY] [--modes "M1 M2 .."] [--kit DIR]
#
#   1. bare start of a CUDA worker through our launcher (python -m elastic_ring.controller.hvdrun):
#      imports + hvd.init() + CUDA context + a barrier; Horovod's NCCL (nccl_built), and with 2+
#      GPUs a two-rank allreduce of a CUDA tensor (NCCL);
#   2. ResNet-110 (CIFAR-shaped synthetic data through the real input pipeline: the batch gathered,
#      augmented and normalised as in training), batch 128 on one GPU: images/s of
#      `elastic-ring train`, its checkpoint write (background stall and write seconds), and the NVML
#      telemetry the controller adds to the throughput events (the check FAILS when it lists no GPU);
#   3. a stop with checkpoint (Ctrl-C) and a restart (--resume) on the GPU: the restarted
#      worker's start-up phases and launch -> first step;
#   4. with 2+ GPUs: one resize 1 -> 2 -> 1 with each relaunch mode (prelaunch, overlap,
#      sequential, inplace; --modes picks some): each resize's time lost and its breakdown.
# Writes a Markdown report (default results/gpu_check.md, meant for docs/gpu.md) and prints it;
# exits 1 after writing it when a check failed (the report says which).
#
# --kit DIR: a machine without Horovod or pydantic and without a package index (the lent GPU
# machine): install the kit made by `scripts/gpu_kit.py build` first (its wheels, and Horovod
# built there with NCCL for that GPU's architecture; 2-4 minutes, once per machine).
# Without a GPU it stops at once (exit 2) with one line saying so. `--device cpu` is the dry run:
# the same steps with tiny sizes on the CPU (gloo), so that the script is known to work before a
# GPU ever runs it (tests/integration/test_inplace_gpu_check.py runs it).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
T_START=$(date +%s)
DEVICE=cuda
OUT=""
PY="${ROOT}/.venv/bin/python"
MODES="prelaunch overlap sequential inplace"
KIT=""
usage() { echo "usage: scripts/gpu_check.sh [--device cuda|cpu] [--out FILE] [--python PY] [--modes \"M ..\"] [--kit DIR]" >&2; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --device) DEVICE="${2:-}"; shift 2 ;;
    --out) OUT="${2:-}"; shift 2 ;;
    --python) PY="${2:-}"; shift 2 ;;
    --modes) MODES="${2:-}"; shift 2 ;;
    --kit) KIT="${2:-}"; shift 2 ;;
    -h|--help) sed -n '2,28p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_check: unknown option $1" >&2; usage; exit 2 ;;
  esac
done
if [[ "$DEVICE" != cuda && "$DEVICE" != cpu ]]; then
  echo "gpu_check: --device must be cuda or cpu, got '${DEVICE}'" >&2; exit 2
fi
for m in $MODES; do
  case "$m" in prelaunch|overlap|sequential|inplace) ;;
    *) echo "gpu_check: unknown relaunch mode '${m}' in --modes (prelaunch overlap sequential inplace)" >&2; exit 2 ;;
  esac
done
[[ -x "$PY" ]] || PY="$(command -v python3)"
OUT="${OUT:-${ROOT}/results/gpu_check${DEVICE/cuda/}.md}"
[[ "$DEVICE" == cpu ]] && OUT="${OUT/gpu_check.md/gpu_check_cpu.md}"
if [[ "$DEVICE" == cuda ]]; then
  NGPU="$("$PY" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)' 2>/dev/null || echo 0)"
  if [[ "$NGPU" -lt 1 ]]; then
    echo "gpu_check: no CUDA GPU visible to torch (torch.cuda.is_available() is False); run it on a GPU node, or --device cpu for the dry run" >&2
    exit 2
  fi
fi
if [[ -n "$KIT" ]]; then
  [[ -f "$KIT/MANIFEST.json" ]] || { echo "gpu_check: --kit $KIT holds no MANIFEST.json (make it with: python scripts/gpu_kit.py build)" >&2; exit 2; }
  kit_vars="$("$PY" "$ROOT/scripts/gpu_kit.py" install --kit "$KIT" --target "${KIT_TARGET:-/tmp/elastic-ring-kit/site}")" \
    || { echo "gpu_check: the kit did not install (see above)" >&2; exit 1; }
  while IFS='=' read -r k v; do [[ -n "$k" ]] && export "$k=$v"; done <<< "$kit_vars"
fi
export PATH="$(dirname "$PY"):${PATH}"
cd "$ROOT"
LEFT=$(( 585 - ($(date +%s) - T_START) ))  # the whole command stays under 10 minutes
[[ "$LEFT" -gt 60 ]] || { echo "gpu_check: only ${LEFT} s left after the kit's install" >&2; exit 1; }
# the runs' folders: one temporary folder, removed however the check ends (an error, its time
# limit, Ctrl-C); the Python part finds it in GPU_CHECK_TMP
GPU_CHECK_TMP="$(mktemp -d "${TMPDIR:-/tmp}/gpu-check-XXXXXX")"
export GPU_CHECK_TMP
trap 'rm -rf "$GPU_CHECK_TMP"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
set +e
timeout "$LEFT" "$PY" - "$DEVICE" "$OUT" $MODES <<'PYEOF'
import json, os, signal, statistics, subprocess, sys, tempfile, time
from pathlib import Path

device, out, modes = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
py, binp = sys.executable, Path(sys.executable).parent
gpu = device == "cuda"
ngpu = 0
if gpu:
    import torch
    ngpu = torch.cuda.device_count()
depth, batch = (110, 128) if gpu else (8, 8)
size = ["--depth", str(depth), "--batch-size", str(batch),
        "--set", "synthetic_size=4096" if gpu else "synthetic_size=64", *([] if gpu else ["--set", "width=4"])]
steps = 300 if gpu else 24
lines = [f"# GPU check ({'CUDA, %d GPU(s)' % ngpu if gpu else 'CPU dry run: tiny sizes'})", "",
         f"{time.strftime('%Y-%m-%d %H:%M')}, `scripts/gpu_check.sh --device {device}`", ""]
if gpu:
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                         capture_output=True, text=True)
    lines += [f"GPU: {smi.stdout.strip() or 'nvidia-smi not found'}", ""]
    from elastic_ring.telemetry.gpu import probe
    lines += [f"elastic-ring's detection: {probe().line()}", ""]
tmp = Path(os.environ.get("GPU_CHECK_TMP") or tempfile.mkdtemp(prefix="gpu-check-"))  # the shell removes it
env = dict(os.environ, PYTHONUNBUFFERED="1")
failures = []  # checks that failed: the report is written, then the exit status is 1
launcher = [py, "-m", "elastic_ring.controller.hvdrun"]  # our launcher (the controller's)


def say(msg):
    print(msg, file=sys.stderr, flush=True)


def events(run, kind):
    p = run / "events.jsonl"
    if not p.exists():
        return []
    return [e for e in map(json.loads, p.read_text().splitlines()) if e["kind"] == kind]


def train(run, *args, check=True):
    # synthetic CIFAR-shaped data through the training input pipeline: gather, augment (pad-4 crop,
    # flip), normalise, as for CIFAR-10 (configs/paper.yaml; the CPU config would turn augment off)
    cmd = [py, "-m", "elastic_ring.cli.main", "train", "--device", device, "--dataset", "synthetic",
           "--set", "augment=true", *size, "--run-dir", str(run), *args]
    if not gpu:
        cmd += ["--slots", "2"]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=400)
    if check and p.returncode != 0:
        raise SystemExit(f"gpu_check: train failed ({p.returncode}): {p.stderr.strip().splitlines()[-1:]}")
    return p

# 1. bare start (our launcher), NCCL
say("1/4 bare start")
bare, nccl_line = [], ""
for _ in range(3 if gpu else 1):
    t0 = time.perf_counter()
    p = subprocess.run([*launcher, "-np", "1", "-H", "localhost:1", "--gloo", py,
                        "launch/bare_start.py", *(["--cuda", "--nccl"] if gpu else [])],
                       capture_output=True, text=True, env=env, timeout=120)
    bare.append(time.perf_counter() - t0)
    if p.returncode != 0:
        raise SystemExit(f"gpu_check: the bare start failed ({p.returncode}): {p.stderr.strip().splitlines()[-3:]}")
    nccl_line = next((ln.split("]<stdout>:")[-1].strip() for ln in p.stdout.splitlines() if "nccl_built=" in ln), "")
lines += ["## Bare start of one worker", "",
          f"our launcher (horovodrun's) + imports + hvd.init(){' + CUDA context' if gpu else ''} + barrier: "
          f"median {statistics.median(bare):.2f} s of {', '.join(f'{b:.2f}' for b in bare)}", ""]
if gpu:
    lines += [f"One rank, a CUDA tensor allreduced: `{nccl_line or 'no output'}`", ""]
    if "nccl_built=1" not in nccl_line:
        failures.append("Horovod has no NCCL (hvd.nccl_built() is false): GPU gradients would go through the host")
    if ngpu >= 2:
        p = subprocess.run([*launcher, "-np", "2", "-H", "localhost:2", "--gloo", py, "launch/bare_start.py",
                            "--cuda", "--nccl"], capture_output=True, text=True, env=env, timeout=180)
        two = next((ln.split("]<stdout>:")[-1].strip() for ln in p.stdout.splitlines() if "nccl_built=" in ln), "")
        lines += ["Two ranks on two GPUs, one allreduce of a 4 MB CUDA tensor (sum checked; NCCL's set-up "
                  f"included): `{two or 'failed: ' + ' '.join(p.stderr.strip().splitlines()[-2:])}`", ""]
        if p.returncode != 0 or "ranks=2" not in two:
            failures.append("the two-rank NCCL allreduce failed")
    else:
        lines += ["Two-rank NCCL step: skipped, one GPU on this machine.", ""]

# 2. throughput, checkpoint, telemetry
say("2/4 throughput")
run = tmp / "thr"
train(run, "--gpus", "1", "--steps", str(steps), "--checkpoint-every", str(steps // 3))
thr = [e for e in events(run, "throughput") if e["step"] - e["steps"] >= (20 if gpu else 4)]
ips = sum(e["images_per_s"] * e["seconds"] for e in thr) / sum(e["seconds"] for e in thr)
ck = events(run, "checkpoint_written")
tel = [e.get("telemetry") or {} for e in events(run, "throughput")]
gpu_keys = sorted({k for t in tel for k in t if "gpu" in k.lower()})
first = events(run, "first_step")[0]
lines += ["## Steady state, one worker", "",
          f"ResNet-{depth}, batch {batch}, synthetic CIFAR-shaped data augmented (crop + flip) and normalised "
          f"as in training{' on the GPU' if gpu else ''}: **{ips:.0f} images/s** (steps after the warm-up, "
          f"{len(thr)} windows)", "",
          f"First step {first['since_launch_s']:.2f} s after the worker started; phases: "
          + ", ".join(f"{k} {v:.2f} s" for k, v in first["phases"].items()), "",
          f"Checkpoints: {len(ck)}, write median {statistics.median(e['seconds'] for e in ck):.3f} s, "
          f"stall on the training thread median {statistics.median(e['stall_s'] for e in ck):.3f} s, "
          f"{ck[-1]['bytes'] / 1e6:.1f} MB", "",
          f"Telemetry in throughput events: {len([t for t in tel if t])}/{len(tel)} carry it; "
          f"GPU fields: {', '.join(gpu_keys) or 'none'}", ""]
gpus_listed = max((len(t.get("gpus") or []) for t in tel), default=0)
lines += [f"GPUs listed in the telemetry: {gpus_listed}", ""]
if gpu and gpus_listed == 0:
    failures.append("the telemetry of the throughput events lists no GPU (NVML)")

# 3. stop with checkpoint, restart with --resume
say("3/4 stop and restart")
run = tmp / "restart"
cmd = [py, "-m", "elastic_ring.cli.main", "train", "--device", device, "--dataset", "synthetic",
       # long enough that the Ctrl-C (after the first 5-step window) lands before the end, short
       # enough that the resume fits on a loaded CPU (tiny CPU steps run at 0.5 to 100+ a second)
       "--set", "augment=true", *size, "--gpus", "1", "--steps", str(steps * (2 if gpu else 6)),
       "--set", "throughput_window=5",
       "--run-dir", str(run)]
if not gpu:
    cmd += ["--slots", "2"]
proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
t0 = time.time()
while not events(run, "throughput") and time.time() - t0 < 180 and proc.poll() is None:
    time.sleep(0.3)
proc.send_signal(signal.SIGINT)
proc.wait(timeout=120)
p = subprocess.run([py, "-m", "elastic_ring.cli.main", "train", "--resume", str(run),
                    *([] if gpu else ["--slots", "2"])], capture_output=True, text=True, env=env, timeout=600)
firsts = events(run, "first_step")
seg_end = [e for e in events(run, "segment_end") if e["segment"] == 0]
if p.returncode != 0 or len(firsts) < 2:
    raise SystemExit(f"gpu_check: the resume failed ({p.returncode}): {p.stderr.strip().splitlines()[-1:]}")
lines += ["## Stop with checkpoint, restart on the device", "",
          f"Ctrl-C stopped at step {seg_end[0]['step'] if seg_end else '?'}; the restarted worker's first step "
          f"{firsts[1]['since_launch_s']:.2f} s after it started; phases: "
          + ", ".join(f"{k} {v:.2f} s" for k, v in firsts[1]["phases"].items()), ""]

# 4. one resize per relaunch mode (needs two devices)
say("4/4 resizes")
if gpu and ngpu < 2:
    lines += ["## Resize per relaunch mode", "", "Skipped: one GPU (a resize 1 -> 2 needs two).", ""]
else:
    rs = steps // 3
    rows = ["| relaunch mode | resize | stop (s) | checkpoint (s) | relaunch to 1st step (s) | time lost (s) |",
            "|---|---|---|---|---|---|"]
    for mode in modes:
        run = tmp / f"resize-{mode}"
        train(run, "--gpus", "1", "--schedule", f"{rs}:2,{2 * rs}:1", "--steps", str(3 * rs), "--relaunch", mode)
        for o in events(run, "resize_overhead"):
            rows.append(f"| {mode} | {o['from_workers']} -> {o['to_workers']} | {o['stop_latency_s']:.2f} | "
                        f"{o['checkpoint_s']:.3f} | {o['relaunch_to_first_step_s']:.2f} | {o['total_lost_s']:.2f} |")
    lines += ["## Resize per relaunch mode", "", *rows, ""]
lines += ["## Checks", ""] + ([f"- FAILED: {f}" for f in failures] or ["All checks passed."]) + [""]
out.parent.mkdir(parents=True, exist_ok=True)
out.write_text("\n".join(lines))
print("\n".join(lines))
print(f"written {out}", file=sys.stderr)
if failures:
    sys.exit(1)
PYEOF
exit $?
