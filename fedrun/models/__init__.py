"""Model definitions (nn.Module only) and the flat-parameter helpers the simulator uses.

Every model is an ``nn.Module`` whose parameters the simulator handles as one flat float32 vector;
:class:`FlatParams` maps between that vector and the module's named parameters so local training can
run many clients at once with ``torch.func.functional_call`` + ``vmap``.
"""

from fedrun.models.flat import FlatParams
from fedrun.models.nets import FashionCNN, FemnistCNN, LeNet5, LinearRegression, build_model
