# sandbox stand-in of patch/model_state.py: Engram staging before forward (CUDA graph safe)
ORIGIN = "patch"
PATCHED = True
REVISION = 1
