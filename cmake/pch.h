// The LibTorch headers every opfuse target includes, precompiled once.
#pragma once
#include <torch/torch.h>
#include <torch/library.h>
#include <ATen/native/TensorIterator.h>
