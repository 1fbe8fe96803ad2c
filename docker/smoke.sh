#!/usr/bin/env bash
# Build the CPU image, run it, wait until it is healthy, transcribe a clip over HTTP, stop it; print what each step
# took, the image's size and how the container exited (143: stopped by SIGTERM in time; 137: killed at the grace).
#
#   bash docker/smoke.sh path/to/clip.flac [extra docker build args...]
#   e.g. bash docker/smoke.sh jfk.flac --build-arg TORCH_INDEX_URL=http://mirror/whl/cpu
#
# Needs a Docker daemon (DOCKER_HOST as usual). Runs the container on the host network (port 8000 must be free)
# with --read-only and --cpus 1, as a locked-down deployment would.
set -euo pipefail
clip=${1:?usage: docker/smoke.sh CLIP [docker build args...]}
shift
cd "$(dirname "$0")/.."
image=${IMAGE:-whisper-server:cpu}
name=whisper-smoke-$$
port=${PORT:-8000}
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
