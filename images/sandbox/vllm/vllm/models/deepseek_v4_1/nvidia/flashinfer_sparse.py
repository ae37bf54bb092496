# sandbox stand-in: the vLLM branch tree (commit e47aa780b), unpatched
ORIGIN = "branch"
PATCHED = False
