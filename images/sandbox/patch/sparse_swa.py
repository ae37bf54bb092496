# sandbox stand-in of patch/sparse_swa.py: SWA block size hook
ORIGIN = "patch"
PATCHED = True
REVISION = 1
