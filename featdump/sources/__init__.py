"""Model sources: each builds an nn.Module and its preprocessing from what --model names.

    torchvision_models  resnet50, vit_b_16, ... (torchvision's classification models)
    timm_models         timm:NAME
    factory             package.module:callable (your own code)
    files               a whole model saved with torch.save(model) (--trust-pickle)
"""
