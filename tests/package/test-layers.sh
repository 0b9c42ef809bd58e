#!/usr/bin/env bash
# The measures of core/'s layering (issue 30), kept: no file of core/
# or plugin/ over 800 lines, no function over 120, no circle of more
# than two files calling each other, every core/ file on a floor and
# no call up a floor (docs/design.md, "Floors of core/").
#
# Truth: the source itself, read by tools/layers.py, which exits 1 and
# names what it found when a measure is exceeded.
source "${top_srcdir:-$(dirname "$0")/../..}/tests/functions.sh"
requires python3 --version

cd "${top_srcdir:-$(dirname "$0")/../..}"
python3 tools/layers.py --edges core plugin ||
  fail "a measure of the layering is exceeded (see above)"
