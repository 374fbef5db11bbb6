#!/bin/sh
# Creates the Python virtualenv for the Hugging Face reference tools (tests/reference/
# make_hf_fixtures.py, check_hf_export.py, dump_hf_logits.py, make_lora_fixtures.py,
# check_peft_export.py). Idempotent: an existing venv
# that already imports everything is left as it is.
#   ZT_VENV   venv path (default $HOME/.cache/ztrain-venv)
#   ZT_PYTHON interpreter that creates it (default python3; Debian needs python3-venv)
# Plain PyPI; torch is several GB, so the first run takes minutes.
set -eu
VENV=${ZT_VENV:-$HOME/.cache/ztrain-venv}
PY=${ZT_PYTHON:-python3}
PKGS="torch transformers peft tokenizers safetensors h5py numpy"
if [ ! -x "$VENV/bin/python" ]; then
  echo "make-venv: creating $VENV with $($PY --version 2>&1)"
  "$PY" -m venv "$VENV"
fi
if "$VENV/bin/python" -c "import torch, transformers, peft, tokenizers, safetensors, h5py, numpy" 2>/dev/null; then
  echo "make-venv: $VENV already has all packages"
else
  "$VENV/bin/python" -m pip install --upgrade pip
  "$VENV/bin/python" -m pip install $PKGS
fi
"$VENV/bin/python" - <<'PY'
import sys, importlib
print("python", sys.version.split()[0])
for m in ("torch", "transformers", "peft", "tokenizers", "safetensors", "h5py", "numpy"):
    print(m, importlib.import_module(m).__version__)
PY
