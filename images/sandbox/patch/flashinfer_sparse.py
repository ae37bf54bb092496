# sandbox stand-in of patch/flashinfer_sparse.py: 64-state pages
ORIGIN = "patch"
PATCHED = True
REVISION = 1
