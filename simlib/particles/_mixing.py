"""Per-pair parameters from per-particle ones (mixing rules) and species tables.

Inside a pair sum, a potential reads ``params[name]`` and sees, for every pair ``(i, j)``:
- a scalar as it is, or, for a name with a mixing rule, combined with itself (the same
  value for every particle: ``masses=m`` gives the pair ``m * m``);
- an ``(S, S)`` table indexed by ``params["species"]``: ``table[s_i, s_j]``;
- a per-particle ``(n,)`` array combined by the mixing rule for its name: the product for
  ``masses`` and ``charges``; Lorentz-Berthelot for ``sigma`` (arithmetic mean) and
  ``epsilon`` (geometric mean) (Allen & Tildesley 2017, §1.4.2). Other names need a rule,
  given as ``pair_energy(..., mixing={name: rule})`` with ``rule(a_i, a_j)``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import jax.numpy as jnp


def product(a, b):
    return a * b


def arithmetic_mean(a, b):
    return 0.5 * (a + b)


def geometric_mean(a, b):
    # sqrt's derivative is infinite at 0: a zero product (a particle without Lennard-Jones,
    # such as a water hydrogen) would give 0 * inf = nan in every gradient. Its value and
    # derivative there are 0 (sqrt(a b) = 0 along any change of a nonzero factor); a
    # negative product still gives nan.
    p = a * b
    zero = p == 0
    return jnp.where(zero, 0.0, jnp.sqrt(jnp.where(zero, 1.0, p)))


MIXING_RULES: dict[str, Callable] = {
    "masses": product,
    "charges": product,
    "sigma": arithmetic_mean,
    "epsilon": geometric_mean,
}


class PairParams(Mapping):
    """A read-only view of ``params`` that combines each value for the pairs on access.

    ``take_i`` and ``take_j`` map a per-particle ``(n,)`` array to the values of the first
    and second particle of every pair (arrays that broadcast against the pair distances).
    """

    def __init__(self, params: Mapping, n: int, take_i, take_j, rules: Mapping[str, Callable]):
        if not isinstance(params, Mapping):
            raise TypeError(f"params must be a dict of named parameters, got "
                            f"{type(params).__name__}")
        self._params = params
        self._n = n
        self._take_i = take_i
        self._take_j = take_j
        self._rules = rules
        self._cache: dict = {}

    def __iter__(self):
        return iter(self._params)

    def __len__(self):
        return len(self._params)

    def __contains__(self, key):
        return key in self._params

    def __getitem__(self, key):
        if key in self._cache:
            return self._cache[key]
        if key not in self._params:
            raise KeyError(f"the potential needs params[{key!r}], which is missing "
                           f"(params has {sorted(self._params)})")
        value = jnp.asarray(self._params[key])
        if value.ndim == 0:
            # A scalar is the same value for every particle: combined with itself, so
            # masses=m gives the pair m*m, and sigma, epsilon stay as they are.
            rule = self._rules.get(key)
            out = value if rule is None else rule(value, value)
        elif value.ndim == 2 and key != "species" and "species" in self._params:
            species = jnp.asarray(self._params["species"])
            out = value[self._take_i(species), self._take_j(species)]
        elif value.ndim == 1 and value.shape[0] == self._n:
            rule = self._rules.get(key)
            if rule is None:
                raise ValueError(
                    f"params[{key!r}] has one value per particle (shape {value.shape}) but no "
                    f"mixing rule; pass pair_energy(..., mixing={{{key!r}: rule}}) with "
                    f"rule(a_i, a_j) -> pair value")
            out = rule(self._take_i(value), self._take_j(value))
        else:
            raise ValueError(
                f"params[{key!r}] must be a scalar, one value per particle (shape ({self._n},)) "
                f"or an (S, S) table with params['species']; got shape {value.shape}")
        self._cache[key] = out
        return out
