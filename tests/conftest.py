import torch

if torch.cuda.is_available():
    # torch's fp32 references must be true fp32: no TF32 in matmul or cuDNN convolutions.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
