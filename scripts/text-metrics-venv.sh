#!/usr/bin/env bash
# Makes the venv the text-similarity parity tests run the reference metrics in, and prints its
# python.
#
#   $RLVR_CACHE_DIR/venvs/text-metrics/   rapidfuzz (fuzz.ratio), sacrebleu (sentence BLEU),
#                                         rouge-score (ROUGE-L), with their dependencies pinned
#
# The versions are the ones the text-similarity plugin's README states parity with. Idempotent: a
# second run finds every package at its version and prints the python at once. Progress goes to
# stderr; stdout is only the python's path.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR
source "$(dirname "$0")/lib.sh"

VENV=$RLVR_CACHE_DIR/venvs/text-metrics
python=$VENV/bin/python
# The metrics, then what they pull in (pinned too, so a new release of a dependency cannot move a
# reference score under the tests).
PINS=(
    rapidfuzz==3.14.6
    sacrebleu==2.6.0
    rouge-score==0.1.2
    portalocker==3.2.0
    regex==2026.11.15
    tabulate==0.10.0
    numpy==2.2.6
    colorama==0.4.6
    lxml==6.1.3
    absl-py==2.5.1
    nltk==3.9.2
    six==1.17.0
    click==8.2.1
    joblib==1.5.2
    tqdm==4.67.1
)

installed() {
    [ -x "$python" ] && "$python" - "${PINS[@]}" <<'PY' 2>/dev/null
import importlib.metadata as m, sys
for pin in sys.argv[1:]:
    name, version = pin.split("==")
    if m.version(name) != version:
        sys.exit(1)
import rapidfuzz, sacrebleu, rouge_score.rouge_scorer  # noqa: F401
PY
}

mkdir -p "$RLVR_CACHE_DIR/venvs"
exec 9>"$RLVR_CACHE_DIR/venvs/.text-metrics.lock"
flock 9
if installed; then
    echo "$python"
    exit 0
fi

step "rapidfuzz, sacrebleu and rouge-score in $VENV"
[ -x "$python" ] || /usr/bin/python3 -m venv "$VENV"
pip_install "$python" "${PINS[@]}" >&2
installed || { echo "the text metrics did not install into $VENV at their pinned versions" >&2; exit 1; }
echo "$python"
