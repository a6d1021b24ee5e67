#!/usr/bin/env bash
# The main job: installs what is missing, builds, writes the KJV corpus, trains the default
# GPT (configs/default.ini, about 3 minutes on 2 cores). Extra flags go to `meshtrain train`.
set -euo pipefail
cd "$(dirname "$0")"
scripts/deps.sh run
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release > /dev/null
cmake --build build -j"$(nproc)" --target meshtrain_cli
[ -f data/kjv/train.bin ] && [ -f data/kjv/val.bin ] || build/meshtrain data kjv --out data/kjv
exec build/meshtrain train --config configs/default.ini "$@"
