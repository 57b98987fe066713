# Sourced by the .ci/*_check.sh scripts: the repository's root and the
# server binary they drive.
#
#   . "$(dirname "${BASH_SOURCE[0]}")/binary.sh" NAME [path/to/retry-budget]
#
# sets ROOT and BIN (absolute; default target/debug/retry-budget), and exits
# 2 with a message naming NAME when the binary is not there.
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${2:-}
BIN=${BIN:-target/debug/retry-budget}
case "$BIN" in
  /*) ;;
  *) BIN="$PWD/$BIN" ;;
esac
if [[ ! -x "$BIN" ]]; then
  echo "$1: binary not found or not executable: $BIN (run cargo build)" >&2
  exit 2
fi
