#!/bin/bash
# hotpath.sh REV [ROUNDS]: the hot paths' benchmarks of REV against the
# working tree, interleaved (the order alternates each round), each run
# pinned to CPU 1, compared with benchstat. Run it with nothing else going.
set -euo pipefail
rev=${1:?usage: bench/hotpath.sh REV [ROUNDS]}
rounds=${2:-8}
root=$(cd "$(dirname "$0")/.." && pwd)
out=$(mktemp -d)
git -C "$root" worktree add -f "$out/old-tree" "$rev" >/dev/null
trap 'git -C "$root" worktree remove --force "$out/old-tree"' EXIT
declare -A bench=([triagegrpc]='Encode|Decode|ServerStack$|RejectAtTap|TapRefusal|ClientChainOverhead'
	[triagehttp]='Middleware|Transport|WriteError' [admission]='Admission|GateRefusal' [retry]='Do$' [throttle]='Decision' [edge]='Classify')
for p in "${!bench[@]}"; do
	(cd "$out/old-tree" && go test -c -o "$out/old-$p.test" "./$p")
	(cd "$root" && go test -c -o "$out/new-$p.test" "./$p")
done
for r in $(seq 1 "$rounds"); do
	order="old new"
	if (( r % 2 == 0 )); then order="new old"; fi
	for v in $order; do
		for p in "${!bench[@]}"; do
			(cd "$root/$p" && taskset -c 1 "$out/$v-$p.test" -test.run '^$' -test.bench "${bench[$p]}" \
				-test.benchtime 200ms -test.benchmem >>"$out/$v.txt")
		done
	done
done
go run golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da "$out/old.txt" "$out/new.txt"
echo "raw results: $out/old.txt $out/new.txt"
