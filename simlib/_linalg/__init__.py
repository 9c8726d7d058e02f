"""Linear algebra of the implicit solvers: one protocol, dense, banded, sparse and
matrix-free (Newton-Krylov) solvers of ``(M - c J) x = b`` (see :mod:`._base`)."""
