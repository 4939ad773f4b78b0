#!/bin/bash
# Source CANN's environment where the image has one (Ascend: ASCEND_HOME_PATH, bishengir-compile
# on PATH, library paths), then run the command: `farm worker ...` or the health check.
set -euo pipefail
for env_script in /usr/local/Ascend/ascend-toolkit/set_env.sh /usr/local/Ascend/cann/set_env.sh; do
    if [ -f "$env_script" ]; then
        # shellcheck disable=SC1090
        source "$env_script"
        break
    fi
done
exec "$@"
