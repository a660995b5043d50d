"""The five services of the mesh. None imports another: they talk only through the contracts in protos/."""
