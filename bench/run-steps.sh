# What the bench/*-run scripts share: one part per call, every log in OUT/PART, archived after
# every step as OUT/PART.tgz (a run cut short still leaves one file with all it did). Sourced
# after the caller has set `usage` and cd'ed to the repository root; sets part, out, kforge and
# summary from the arguments OUT PART.
part=${2:?$usage}
out=${1:?$usage}/$part
kforge=${KFORGE_BUILD_DIR:-build/ci}/kforge
mkdir -p "$out"
export KFORGE_GIT_SHA=${KFORGE_GIT_SHA:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
summary="$out/summary.txt"
: > "$summary"

archive() {  # OUT/PART.tgz: everything so far (the results database included)
  tar czf "$out.tgz.part" -C "$(dirname "$out")" "$part" && mv "$out.tgz.part" "$out.tgz"
}

# step NAME CMD...: runs with its output in OUT/NAME.log, notes the exit status. The command runs
# in the background and the script waits for it, so that a TERM or INT acts at once (bash defers
# a trap until a foreground command ends) and on_exit's clean-up runs.
step() {
  local name=$1
  shift
  echo "== $name: $*" | tee -a "$summary"
  local started=$SECONDS
  "$@" > "$out/$name.log" 2>&1 &
  wait $!
  local rc=$?
  echo "== $name: exit $rc after $((SECONDS - started)) s" | tee -a "$summary"
  archive
  return $rc
}

# on_exit CMD: CMD (a string, expanded when it runs) runs however the script ends, a TERM or INT
# included, after the step in progress was stopped: for putting back what a part moved aside.
on_exit() {
  trap 'kill $(jobs -p) 2> /dev/null; wait; '"$1" EXIT
  trap 'exit 143' TERM
  trap 'exit 130' INT
}

# The tables' device key of GPU 0 as kforge writes it: "NVIDIA H100 80GB HBM3 (cc 9.0, ...)" ->
# NVIDIA-H100-80GB-HBM3-cc-9-0 (every run of other characters one '-').
this_device_key() {
  local key
  key=$("$kforge" devices |
    sed -n 's/.*cuda:0 \(.*\) (cc \([0-9]\+\)\.\([0-9]\+\),.*/\1 cc \2 \3/p' |
    sed -E 's/[^[:alnum:]]+/-/g; s/^-|-$//g')
  [[ -n $key ]] || { echo "no CUDA device in 'kforge devices'" >&2; return 1; }
  echo "$key"
}
