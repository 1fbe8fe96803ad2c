#!/usr/bin/env bash
# Build the CPU image, run it, wait until it is healthy, transcribe a clip over HTTP, stop it; print what each step
# took, the image's size and how the container exited (143: stopped by SIGTERM in time; 137: killed at the grace).
#
#   bash docker/smoke.sh [--port N] path/to/clip.flac [extra docker build args...]
#   e.g. bash docker/smoke.sh jfk.flac --build-arg TORCH_INDEX_URL=http://mirror/whl/cpu
#
# Needs a Docker daemon on this host (DOCKER_HOST as usual). Runs the container on the host network with --read-only
# and --cpus 1, as a locked-down deployment would, on a port that is free: --port N or PORT=N, else one the
# kernel picks (printed first). A port that is taken stops the script before the build.
set -euo pipefail

# a port no socket listens on: bound to all addresses, as the server binds it (0.0.0.0), with SO_REUSEADDR as
# uvicorn sets it, so a port left in TIME_WAIT counts as free; port 0 lets the kernel pick one
free_port() {
  python3 - "${1:-0}" <<'EOF'
import socket
import sys

port = sys.argv[1]
if not port.isdigit() or int(port) > 65535:
    sys.exit(f"not a port: {port!r}")
with socket.socket() as s:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("", int(port)))
    except OSError as e:
        sys.exit(f"port {port} is in use ({e.strerror}): choose another with --port N or PORT=N")
    print(s.getsockname()[1])
EOF
}

port=${PORT:-}
case ${1:-} in
  --port) port=${2:?--port needs a number}; shift 2 ;;
  --port=*) port=${1#--port=}; shift ;;
esac
clip=${1:?usage: docker/smoke.sh [--port N] CLIP [docker build args...]}
shift
if [ -n "$port" ]; then
  port=$(free_port "$port")
  echo "port: $port"
else
  port=$(free_port)
  echo "port: $port (a free one the kernel picked; --port N or PORT=N chooses)"
fi
cd "$(dirname "$0")/.."
image=${IMAGE:-whisper-server:cpu}
name=whisper-smoke-$$
t0=$(date +%s)
docker build --network host -f docker/Dockerfile.cpu -t "$image" "$@" . > /tmp/$name-build.log 2>&1 \
  || { tail -30 /tmp/$name-build.log; exit 1; }
t1=$(date +%s)
echo "build: $((t1 - t0)) s; image $(docker image inspect -f '{{.Size}}' "$image" | awk '{printf "%.2f GB", $1 / 1e9}')"
docker run -d --name "$name" --network host --read-only --cpus 1 -e WHISPER_PORT="$port" "$image" > /dev/null
trap 'docker rm -f "$name" > /dev/null 2>&1 || true' EXIT
for _ in $(seq 600); do
  status=$(docker inspect -f '{{.State.Health.Status}}' "$name" 2>/dev/null || echo gone)
  curl -sf "http://127.0.0.1:$port/health" > /dev/null && break
  [ "$status" = gone ] && { echo "the container exited"; exit 1; }
  sleep 1
done
t2=$(date +%s)
echo "healthy after $((t2 - t1)) s: $(curl -s "http://127.0.0.1:$port/health")"
echo "user: $(docker exec "$name" id -un); cores it may use (torch's threads): $(docker exec "$name" python -c 'from engine import available_cpus; print(available_cpus())')"
echo "transcript: $(curl -s "http://127.0.0.1:$port/v1/audio/transcriptions" -F model=whisper-1 -F file=@"$clip")"
t3=$(date +%s)
docker stop "$name" > /dev/null
t4=$(date +%s)
code=$(docker inspect -f '{{.State.ExitCode}}' "$name")
echo "stopped in $((t4 - t3)) s, exit code $code"
