#!/usr/bin/env bash
# Scale the kvemu replicas: the StatefulSet's replicas AND the routers' replica list, together.
# The router takes its replica list at start (--replicas, here from KVEMU_REPLICA_URLS) and has
# no endpoint to register replicas later, so a new list is a rolling restart of the routers.
#
#   deploy/k8s/scale-replicas.sh 5              # in kubectl's current namespace
#   deploy/k8s/scale-replicas.sh -n kvemu 5
#   deploy/k8s/scale-replicas.sh --urls 5       # only print the replica list for 5 replicas
#
# The StatefulSet changes first, then the list.  Growing: the new pods are ready before any
# router lists them.  Shrinking: the routers still list the pods that stop, so they see them go
# (a refused connection takes a replica out at once, and a request it refused is retried on
# another), take them out and clear their entries from the Redis index; then the new list.
# A later `kubectl apply -k deploy/k8s/<variant>` resets both to the files: to keep the change,
# also set `replicas:` in base/replicas.yaml and KVEMU_REPLICA_URLS in */router.yaml (--urls N).
set -euo pipefail

STATEFULSET=kvemu-replica  # the headless Service has the same name
ROUTER=kvemu-router
PORT=8100

usage() {
    echo "usage: $0 [-n NAMESPACE] N   |   $0 --urls N   (N >= 1)" >&2
    exit 2
}

urls() {
    local out="" i
    for ((i = 0; i < $1; i++)); do
        out+="${out:+,}http://${STATEFULSET}-${i}.${STATEFULSET}:${PORT}"
    done
    printf '%s\n' "$out"
}

ns=()
case "${1:-}" in
    --urls)
        [[ $# -eq 2 && "$2" =~ ^[1-9][0-9]*$ ]] || usage
        urls "$2"
        exit 0 ;;
    -n)
        [[ $# -ge 2 ]] || usage
        ns=(-n "$2")
        shift 2 ;;
esac
[[ $# -eq 1 && "$1" =~ ^[1-9][0-9]*$ ]] || usage
n=$1
list=$(urls "$n")

k() { kubectl "${ns[@]}" "$@"; }

current=$(k get statefulset "$STATEFULSET" -o jsonpath='{.spec.replicas}')
k scale statefulset "$STATEFULSET" --replicas="$n"
if ((n >= current)); then
    k rollout status statefulset/"$STATEFULSET" --timeout=5m
else
    for ((i = n; i < current; i++)); do
        k wait --for=delete pod/"$STATEFULSET-$i" --timeout=5m
    done
fi
k set env deployment/"$ROUTER" KVEMU_REPLICA_URLS="$list"
k rollout status deployment/"$ROUTER" --timeout=5m
echo "kvemu: $n replica(s); routers list $list"
