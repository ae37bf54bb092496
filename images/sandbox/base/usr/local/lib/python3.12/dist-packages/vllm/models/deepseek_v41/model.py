# sandbox stand-in: the stock vLLM package of the base image (released layout: models/deepseek_v41/)
ORIGIN = "base"
