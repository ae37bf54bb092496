# sandbox stand-in of patch/weight_utils.py: Skip Engram tables on load
ORIGIN = "patch"
PATCHED = True
REVISION = 1
