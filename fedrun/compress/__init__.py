"""Pure tensor math of the compressing schemes (no Hydra, no MLflow, no I/O).

* :mod:`~fedrun.compress.dct` — orthonormal DCT-II / its adjoint via one FFT (paper 000's sensing operator).
* :mod:`~fedrun.compress.masks` — shared-seed randomness: FL-RND's coordinates, FL-CS's shuffling permutation.
* :mod:`~fedrun.compress.l1` — BPDN solvers (FISTA, OWL-QN): FL-CS's decoder.
* :mod:`~fedrun.compress.cs` — :class:`DCTCompressor`: first-m DCT coefficients, zero-fill, L1 reconstruction.
* :mod:`~fedrun.compress.sketch` — count sketch, PRIVIX/HEAPRIX (paper 002).
"""
