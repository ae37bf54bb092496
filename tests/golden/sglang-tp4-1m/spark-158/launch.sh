#!/bin/sh
# sparkctl render: start the engine of profile sglang-tp4-1m on spark-158 (rank 3 of 4, worker).
# This directory belongs at /var/lib/sparkctl/sglang-tp4-1m/ on spark-158: docker reads /var/lib/sparkctl/sglang-tp4-1m/engine.env.
# Same container as compose.yaml. A container named sparkctl-sglang-tp4 must not exist yet
# (remove an old one with: docker rm -f sparkctl-sglang-tp4).
set -eu
docker run -d \
    --restart on-failure \
    --name sparkctl-sglang-tp4 \
    --network host \
    --ipc host \
    --gpus all \
    --ulimit nofile=1048576:1048576 \
    --ulimit memlock=-1:-1 \
    --ulimit stack=67108864:67108864 \
    --cap-add IPC_LOCK \
    --device /dev/infiniband \
    --shm-size 32g \
    --env-file /var/lib/sparkctl/sglang-tp4-1m/engine.env \
    -v /mnt/nvme/models/DeepSeek-V4.1-Flash:/models/DeepSeek-V4.1-Flash:ro \
    -v /mnt/nvme/engram:/engram \
    -v /mnt/nvme/hf-cache:/root/.cache/huggingface \
    --label sparkctl.profile=sglang-tp4-1m \
    --label sparkctl.rank=3 \
    sglang-dsv41:latest \
    python3 -m sglang.launch_server \
        --model-path /models/DeepSeek-V4.1-Flash \
        --served-model-name deepseek-v4.1-flash \
        --host 0.0.0.0 \
        --port 8000 \
        --tp-size 4 \
        --nnodes 4 \
        --node-rank 3 \
        --dist-init-addr 10.10.10.153:20000 \
        --mem-fraction-static 0.8 \
        --context-length 1048576 \
        --max-running-requests 8 \
        --chunked-prefill-size 1024 \
        --page-size 64 \
        --speculative-algorithm DSPARK \
        --fp8-gemm-backend flashinfer_cutlass \
        --watchdog-timeout 1800 \
        --sleep-on-idle \
        --tool-call-parser deepseekv41 \
        --reasoning-parser deepseek-v41 \
        --enable-multimodal \
        --default-chat-template-kwargs '{"thinking":false}' \
        --max-total-tokens 8000000 \
        --cuda-graph-max-bs-decode 8 \
        --ep-size 4 \
        --speculative-dspark-block-size 3 \
        --min-free-slots-delay 1
