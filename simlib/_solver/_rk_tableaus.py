"""Coefficient tables of the explicit Runge-Kutta methods simlib ships.

Every method is a :class:`~simlib._solver._tableau.ButcherTableau`; the stage
matrix ``a`` is given row by row (row ``i`` holds ``a_i0 .. a_i,i-1``), and for
embedded pairs ``b_error = b - b_hat``.  Dense output is stored as polynomial
weights ``b_i(theta) = sum_m dense[i][m-1] * theta**m``.

Where the coefficients come from:

* ``EULER``, ``MIDPOINT``, ``HEUN`` and ``RK4`` are the textbook methods
  (Hairer, Norsett and Wanner, *Solving Ordinary Differential Equations I*,
  2nd ed., Springer, 1993, Sec. II.1).  ``HEUN`` carries the explicit Euler
  step as its embedded first-order estimate, so it can adapt its step size.
* ``BOSH3``: Bogacki and Shampine (1989).  No dense coefficients: the stepper
  interpolates it with a cubic Hermite polynomial.
* ``TSIT5``: Tsitouras (2011).  The coefficients are written to about 25
  significant digits, rounded from the high-precision values of the paper's
  tableau that diffrax and OrdinaryDiffEq.jl distribute; the embedded
  ``b_hat`` has ``b_hat_7 = 1/66``.  The order-4 continuous extension is the
  paper's factored ``b_i(theta)``, multiplied out here (in exact rational
  arithmetic on the printed constants) into the ``dense`` layout.
* ``DOPRI5``: Dormand and Prince (1980).  The order-4 dense output is
  Shampine's (1986) continuous extension, as used by Hairer's DOPRI5 code
  (and scipy's ``RK45``).  It is published as a nested Hermite-like form
  ``theta*(r1 + (1-theta)*(r2 + theta*(r3 + (1-theta)*r4)))`` in the
  increment, ``h*f_old`` and ``h*f_new``; it is multiplied out here exactly.
* ``DOPRI8``: Hairer's DOP853, an 8(5,3) pair derived from Prince and Dormand
  (1981) (Hairer, Norsett and Wanner 1993, Sec. II.10; coefficients as in
  Hairer's Fortran code ``dop853.f``).  Its twelve stages are followed here by
  a thirteenth FSAL stage (``c = 1``, ``a`` row = ``b``) whose derivative
  starts the next step and enters the dense output.  ``b_error`` holds the
  fifth-order error weights and ``b_error3`` the third-order ones, for the
  combined error estimate of the code.  The order-7 dense output uses three
  more stages (``a_extra``/``c_extra``) and is published in the same nested
  ``theta*(1-theta)`` form (seven coefficient vectors: the increment, two
  combinations of the increment with ``h*f_old`` and ``h*f_new``, and four
  rows over all sixteen stages); it is multiplied out here exactly into
  sixteen rows of ``theta**1 .. theta**7`` coefficients.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

from ._tableau import ButcherTableau

_Poly = list[Fraction]  # coefficients, lowest power of theta first


def _poly_mul(p: _Poly, q: _Poly) -> _Poly:
    out = [Fraction(0)] * (len(p) + len(q) - 1)
    for i, x in enumerate(p):
        for j, y in enumerate(q):
            out[i + j] += x * y
    return out


def _poly_add(p: _Poly, q: _Poly) -> _Poly:
    n = max(len(p), len(q))
    p = p + [Fraction(0)] * (n - len(p))
    q = q + [Fraction(0)] * (n - len(q))
    return [x + y for x, y in zip(p, q, strict=True)]


def _dense_row(poly: _Poly, degree: int) -> tuple[float, ...]:
    """Drop the (zero) constant term, pad to ``degree`` and round to floats."""
    if poly[0] != 0:
        raise ValueError("a dense-output weight must vanish at theta = 0")
    coefs = poly[1:] + [Fraction(0)] * (degree + 1 - len(poly))
    if len(coefs) != degree or any(x != 0 for x in coefs[degree:]):
        raise ValueError("dense-output weight has the wrong degree")
    return tuple(float(x) for x in coefs)


def _factored_weight(scale: float, *factors: Sequence[float], degree: int) -> tuple[float, ...]:
    """Multiply out ``scale * prod(factors)``; each factor lists its
    coefficients lowest power first.  Arithmetic is exact on the floats."""
    poly: _Poly = [Fraction(scale)]
    for f in factors:
        poly = _poly_mul(poly, [Fraction(x) for x in f])
    return _dense_row(poly, degree)


def _nested_dense(
    blocks: Sequence[Sequence[Fraction | float]], degree: int
) -> tuple[tuple[float, ...], ...]:
    """Expand the nested form of Hairer's DOPRI5/DOP853 dense output.

    The interpolant is ``y0 + h * sum_i P_i(theta) k_i`` with, per stage ``i``,

        P_i = theta*(F0 + (1-theta)*(F1 + theta*(F2 + (1-theta)*(F3 + ...))))

    where ``F0, F1, ...`` (``blocks``) are each given as one weight per stage:
    the factor in front of block ``m`` is ``theta`` for even ``m`` and
    ``1 - theta`` for odd ``m``.  Multiplied out exactly, rounded once.
    """
    theta: _Poly = [Fraction(0), Fraction(1)]
    one_minus_theta: _Poly = [Fraction(1), Fraction(-1)]
    n_stages = len(blocks[0])
    rows = []
    for i in range(n_stages):
        poly: _Poly = [Fraction(0)]
        for m in reversed(range(len(blocks))):
            poly = _poly_add(poly, [Fraction(blocks[m][i])])
            poly = _poly_mul(poly, theta if m % 2 == 0 else one_minus_theta)
        rows.append(_dense_row(poly, degree))
    return tuple(rows)


def _unit(i: int, n: int) -> tuple[int, ...]:
    return tuple(1 if j == i else 0 for j in range(n))


# ---------------------------------------------------------------------------
# Low-order textbook methods
# ---------------------------------------------------------------------------

EULER = ButcherTableau(
    name="Euler",
    reference=(
        "L. Euler, Institutionum calculi integralis, Vol. I, Petropoli, 1768, Sec. 650; "
        "see E. Hairer, S. P. Norsett, G. Wanner, Solving Ordinary Differential "
        "Equations I, 2nd ed., Springer, 1993, Sec. I.7"
    ),
    order=1,
    a=((),),
    b=(1.0,),
    c=(0.0,),
)

MIDPOINT = ButcherTableau(
    name="Midpoint",
    reference=(
        "C. Runge, Ueber die numerische Aufloesung von Differentialgleichungen, "
        "Mathematische Annalen 46 (1895) 167-178"
    ),
    order=2,
    a=((), (1 / 2,)),
    b=(0.0, 1.0),
    c=(0.0, 1 / 2),
)

# Heun's trapezoidal method; the first stage alone is an Euler step, which is
# the embedded first-order solution (b_hat = (1, 0)).
HEUN = ButcherTableau(
    name="Heun",
    reference=(
        "K. Heun, Neue Methode zur approximativen Integration der "
        "Differentialgleichungen einer unabhaengigen Veraenderlichen, "
        "Zeitschrift fuer Mathematik und Physik 45 (1900) 23-38"
    ),
    order=2,
    a=((), (1.0,)),
    b=(1 / 2, 1 / 2),
    c=(0.0, 1.0),
    b_error=(-1 / 2, 1 / 2),
    error_order=1,
)

RK4 = ButcherTableau(
    name="RK4",
    reference=(
        "W. Kutta, Beitrag zur naeherungsweisen Integration totaler "
        "Differentialgleichungen, Zeitschrift fuer Mathematik und Physik 46 (1901) 435-453"
    ),
    order=4,
    a=((), (1 / 2,), (0.0, 1 / 2), (0.0, 0.0, 1.0)),
    b=(1 / 6, 1 / 3, 1 / 3, 1 / 6),
    c=(0.0, 1 / 2, 1 / 2, 1.0),
)

# ---------------------------------------------------------------------------
# Bogacki-Shampine 3(2)
# ---------------------------------------------------------------------------

# b_hat = (7/24, 1/4, 1/3, 1/8); b_error = b - b_hat.
BOSH3 = ButcherTableau(
    name="Bosh3",
    reference=(
        "P. Bogacki, L. F. Shampine, A 3(2) pair of Runge-Kutta formulas, "
        "Applied Mathematics Letters 2(4) (1989) 321-325"
    ),
    order=3,
    a=((), (1 / 2,), (0.0, 3 / 4), (2 / 9, 1 / 3, 4 / 9)),
    b=(2 / 9, 1 / 3, 4 / 9, 0.0),
    c=(0.0, 1 / 2, 3 / 4, 1.0),
    b_error=(-5 / 72, 1 / 12, 1 / 9, -1 / 8),
    error_order=2,
    fsal=True,
)

# ---------------------------------------------------------------------------
# Tsitouras 5(4)
# ---------------------------------------------------------------------------

_TSIT5_B = (
    0.09646076681806522951816731,
    1 / 100,
    0.4798896504144995747752495,
    1.379008574103741893192275,
    -3.290069515436080679901048,
    2.324710524099773982415356,
    0.0,
)
_TSIT5_B_HAT = (
    0.09468075576583945807478876,
    0.009183565540343253096776364,
    0.4877705284247615707855643,
    1.234297566930478985655110,
    -2.707712349983525454881110,
    1.866628418170587035753719,
    1 / 66,
)

# The paper's continuous extension, b_i(theta) in factored form.
_TSIT5_DENSE = (
    _factored_weight(
        -1.0530884977290216,
        (0.0, 1.0),
        (-1.3299890189751412, 1.0),
        (0.7139816917074209, -1.4364028541716351, 1.0),
        degree=4,
    ),
    _factored_weight(
        0.1017, (0.0, 0.0, 1.0), (1.2949852507374631, -2.1966568338249754, 1.0), degree=4
    ),
    _factored_weight(
        2.490627285651252793,
        (0.0, 0.0, 1.0),
        (1.57803468208092486, -2.38535645472061657, 1.0),
        degree=4,
    ),
    _factored_weight(
        -16.54810288924490272,
        (0.0, 0.0, 1.0),
        (-1.21712927295533244, 1.0),
        (-0.61620406037800089, 1.0),
        degree=4,
    ),
    _factored_weight(
        47.37952196281928122,
        (0.0, 0.0, 1.0),
        (-1.203071208372362603, 1.0),
        (-0.658047292653547382, 1.0),
        degree=4,
    ),
    _factored_weight(
        -34.87065786149660974,
        (0.0, 0.0, 1.0),
        (-1.2, 1.0),
        (-0.666666666666666667, 1.0),
        degree=4,
    ),
    _factored_weight(2.5, (0.0, 0.0, 1.0), (-1.0, 1.0), (-0.6, 1.0), degree=4),
)

TSIT5 = ButcherTableau(
    name="Tsit5",
    reference=(
        "Ch. Tsitouras, Runge-Kutta pairs of order 5(4) satisfying only the first "
        "column simplifying assumption, Computers & Mathematics with Applications "
        "62(2) (2011) 770-775"
    ),
    order=5,
    a=(
        (),
        (0.161,),
        (-0.008480655492356988544426874, 0.3354806554923569885444269),
        (2.897153057105493432130433, -6.359448489975074843148160, 4.362295432869581411017727),
        (
            5.325864828439256604428878,
            -11.74888356406282787774717,
            7.495539342889836208304605,
            -0.09249506636175524925650208,
        ),
        (
            5.861455442946420028659251,
            -12.92096931784710929170612,
            8.159367898576158643180401,
            -0.07158497328140099722453054,
            -0.02826905039406838290900306,
        ),
        _TSIT5_B[:6],
    ),
    b=_TSIT5_B,
    c=(0.0, 0.161, 0.327, 0.9, 0.9800255409045096857298103, 1.0, 1.0),
    b_error=tuple(x - y for x, y in zip(_TSIT5_B, _TSIT5_B_HAT, strict=True)),
    error_order=4,
    fsal=True,
    dense=_TSIT5_DENSE,
    dense_order=4,
)

# ---------------------------------------------------------------------------
# Dormand-Prince 5(4)
# ---------------------------------------------------------------------------

_DOPRI5_B = (35 / 384, 0.0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84, 0.0)
_DOPRI5_B_EXACT = (
    Fraction(35, 384),
    Fraction(0),
    Fraction(500, 1113),
    Fraction(125, 192),
    Fraction(-2187, 6784),
    Fraction(11, 84),
    Fraction(0),
)
# Shampine's dense-output coefficients (Hairer's d1..d7; d2 = 0).
_DOPRI5_D = (
    Fraction(-12715105075, 11282082432),
    Fraction(0),
    Fraction(87487479700, 32700410799),
    Fraction(-10690763975, 1880347072),
    Fraction(701980252875, 199316789632),
    Fraction(-1453857185, 822651844),
    Fraction(69997945, 29380423),
)


def _hermite_blocks(
    b: Sequence[Fraction | float], n: int, last: int
) -> list[tuple[Fraction | float, ...]]:
    """First three nested blocks of the DOPRI-type dense output, per stage:
    the increment ``b``; ``h*f_old - increment``; and
    ``2*increment - h*f_old - h*f_new`` (``f_old`` = stage 0, ``f_new`` =
    stage ``last``); ``b`` is padded with zeros to ``n`` stages."""
    bb = [Fraction(x) for x in b] + [Fraction(0)] * (n - len(b))
    e0, el = _unit(0, n), _unit(last, n)
    return [
        tuple(bb),
        tuple(e0[i] - bb[i] for i in range(n)),
        tuple(2 * bb[i] - e0[i] - el[i] for i in range(n)),
    ]


DOPRI5 = ButcherTableau(
    name="Dopri5",
    reference=(
        "J. R. Dormand, P. J. Prince, A family of embedded Runge-Kutta formulae, "
        "Journal of Computational and Applied Mathematics 6(1) (1980) 19-26; "
        "dense output: L. F. Shampine, Some practical Runge-Kutta formulas, "
        "Mathematics of Computation 46(173) (1986) 135-150"
    ),
    order=5,
    a=(
        (),
        (1 / 5,),
        (3 / 40, 9 / 40),
        (44 / 45, -56 / 15, 32 / 9),
        (19372 / 6561, -25360 / 2187, 64448 / 6561, -212 / 729),
        (9017 / 3168, -355 / 33, 46732 / 5247, 49 / 176, -5103 / 18656),
        _DOPRI5_B[:6],
    ),
    b=_DOPRI5_B,
    c=(0.0, 1 / 5, 3 / 10, 4 / 5, 8 / 9, 1.0, 1.0),
    # b_hat = (5179/57600, 0, 7571/16695, 393/640, -92097/339200, 187/2100, 1/40)
    b_error=(71 / 57600, 0.0, -71 / 16695, 71 / 1920, -17253 / 339200, 22 / 525, -1 / 40),
    error_order=4,
    fsal=True,
    dense=_nested_dense([*_hermite_blocks(_DOPRI5_B_EXACT, 7, 6), _DOPRI5_D], degree=4),
    dense_order=4,
)

# ---------------------------------------------------------------------------
# DOP853 (Dormand-Prince 8(5,3) as adapted by Hairer)
# ---------------------------------------------------------------------------

_DOP853_C = (
    0.0,
    0.526001519587677318785587544488e-1,
    0.789002279381515978178381316732e-1,
    0.118350341907227396726757197510,
    0.281649658092772603273242802490,
    0.333333333333333333333333333333,
    0.25,
    0.307692307692307692307692307692,
    0.651282051282051282051282051282,
    0.6,
    0.857142857142857142857142857142,
    1.0,
)

# The long coefficient tables below are laid out by hand, several per line.
# fmt: off

# Rows 1..11 of the twelve DOP853 stages (row 0 is empty).
_DOP853_A = (
    (),
    (
        5.26001519587677318785587544488e-2,
    ),
    (
        1.97250569845378994544595329183e-2, 5.91751709536136983633785987549e-2,
    ),
    (
        2.95875854768068491816892993775e-2, 0.0, 8.87627564304205475450678981324e-2,
    ),
    (
        2.41365134159266685502369798665e-1, 0.0, -8.84549479328286085344864962717e-1,
        9.24834003261792003115737966543e-1,
    ),
    (
        3.7037037037037037037037037037e-2, 0.0, 0.0, 1.70828608729473871279604482173e-1,
        1.25467687566822425016691814123e-1,
    ),
    (
        3.7109375e-2, 0.0, 0.0, 1.70252211019544039314978060272e-1,
        6.02165389804559606850219397283e-2, -1.7578125e-2,
    ),
    (
        3.70920001185047927108779319836e-2, 0.0, 0.0, 1.70383925712239993810214054705e-1,
        1.07262030446373284651809199168e-1, -1.53194377486244017527936158236e-2,
        8.27378916381402288758473766002e-3,
    ),
    (
        6.24110958716075717114429577812e-1, 0.0, 0.0, -3.36089262944694129406857109825,
        -8.68219346841726006818189891453e-1, 2.75920996994467083049415600797e1,
        2.01540675504778934086186788979e1, -4.34898841810699588477366255144e1,
    ),
    (
        4.77662536438264365890433908527e-1, 0.0, 0.0, -2.48811461997166764192642586468,
        -5.90290826836842996371446475743e-1, 2.12300514481811942347288949897e1,
        1.52792336328824235832596922938e1, -3.32882109689848629194453265587e1,
        -2.03312017085086261358222928593e-2,
    ),
    (
        -9.3714243008598732571704021658e-1, 0.0, 0.0, 5.18637242884406370830023853209,
        1.09143734899672957818500254654, -8.14978701074692612513997267357,
        -1.85200656599969598641566180701e1, 2.27394870993505042818970056734e1,
        2.49360555267965238987089396762, -3.0467644718982195003823669022,
    ),
    (
        2.27331014751653820792359768449, 0.0, 0.0, -1.05344954667372501984066689879e1,
        -2.00087205822486249909675718444, -1.79589318631187989172765950534e1,
        2.79488845294199600508499808837e1, -2.85899827713502369474065508674,
        -8.87285693353062954433549289258, 1.23605671757943030647266201528e1,
        6.43392746015763530355970484046e-1,
    ),
)

# Weights of the eighth-order solution (b_1 .. b_12).
_DOP853_B = (
    5.42937341165687622380535766363e-2, 0.0, 0.0, 0.0, 0.0, 4.45031289275240888144113950566,
    1.89151789931450038304281599044, -5.8012039600105847814672114227,
    3.1116436695781989440891606237e-1, -1.52160949662516078556178806805e-1,
    2.01365400804030348374776537501e-1, 4.47106157277725905176885569043e-2,
)

# Fifth-order error weights (Hairer's er1 .. er12).
_DOP853_E5 = (
    0.1312004499419488073250102996e-1, 0.0, 0.0, 0.0, 0.0, -0.1225156446376204440720569753e1,
    -0.4957589496572501915214079952, 0.1664377182454986536961530415e1,
    -0.3503288487499736816886487290, 0.3341791187130174790297318841,
    0.8192320648511571246570742613e-1, -0.2235530786388629525884427845e-1,
)

# Third-order embedded weights (Hairer's bhh1, bhh2, bhh3 on stages 1, 9, 12).
_DOP853_B_HAT3 = (
    0.244094488188976377952755905512, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0,
    0.733846688281611857341361741547, 0.0, 0.0, 0.220588235294117647058823529412e-1,
)

# Extra stages 14, 15, 16 for dense output (rows over all earlier stages,
# the FSAL stage 13 included).
_DOP853_C_EXTRA = (0.1, 0.2, 0.777777777777777777777777777778)
_DOP853_A_EXTRA = (
    (
        5.61675022830479523392909219681e-2, 0.0, 0.0, 0.0, 0.0, 0.0,
        2.53500210216624811088794765333e-1, -2.46239037470802489917441475441e-1,
        -1.24191423263816360469010140626e-1, 1.5329179827876569731206322685e-1,
        8.20105229563468988491666602057e-3, 7.56789766054569976138603589584e-3, -8.298e-3,
    ),
    (
        3.18346481635021405060768473261e-2, 0.0, 0.0, 0.0, 0.0,
        2.83009096723667755288322961402e-2, 5.35419883074385676223797384372e-2,
        -5.49237485713909884646569340306e-2, 0.0, 0.0, -1.08347328697249322858509316994e-4,
        3.82571090835658412954920192323e-4, -3.40465008687404560802977114492e-4,
        1.41312443674632500278074618366e-1,
    ),
    (
        -4.28896301583791923408573538692e-1, 0.0, 0.0, 0.0, 0.0,
        -4.69762141536116384314449447206, 7.68342119606259904184240953878,
        4.06898981839711007970213554331, 3.56727187455281109270669543021e-1, 0.0, 0.0, 0.0,
        -1.39902416515901462129418009734e-3, 2.9475147891527723389556272149,
        -9.15095847217987001081870187138,
    ),
)

# The four last blocks of the nested dense output (Hairer's d4.. d7 rows),
# over all sixteen stages.
_DOP853_D = (
    (
        -0.84289382761090128651353491142e+1, 0.0, 0.0, 0.0, 0.0,
        0.56671495351937776962531783590, -0.30689499459498916912797304727e+1,
        0.23846676565120698287728149680e+1, 0.21170345824450282767155149946e+1,
        -0.87139158377797299206789907490, 0.22404374302607882758541771650e+1,
        0.63157877876946881815570249290, -0.88990336451333310820698117400e-1,
        0.18148505520854727256656404962e+2, -0.91946323924783554000451984436e+1,
        -0.44360363875948939664310572000e+1,
    ),
    (
        0.10427508642579134603413151009e+2, 0.0, 0.0, 0.0, 0.0,
        0.24228349177525818288430175319e+3, 0.16520045171727028198505394887e+3,
        -0.37454675472269020279518312152e+3, -0.22113666853125306036270938578e+2,
        0.77334326684722638389603898808e+1, -0.30674084731089398182061213626e+2,
        -0.93321305264302278729567221706e+1, 0.15697238121770843886131091075e+2,
        -0.31139403219565177677282850411e+2, -0.93529243588444783865713862664e+1,
        0.35816841486394083752465898540e+2,
    ),
    (
        0.19985053242002433820987653617e+2, 0.0, 0.0, 0.0, 0.0,
        -0.38703730874935176555105901742e+3, -0.18917813819516756882830838328e+3,
        0.52780815920542364900561016686e+3, -0.11573902539959630126141871134e+2,
        0.68812326946963000169666922661e+1, -0.10006050966910838403183860980e+1,
        0.77771377980534432092869265740, -0.27782057523535084065932004339e+1,
        -0.60196695231264120758267380846e+2, 0.84320405506677161018159903784e+2,
        0.11992291136182789328035130030e+2,
    ),
    (
        -0.25693933462703749003312586129e+2, 0.0, 0.0, 0.0, 0.0,
        -0.15418974869023643374053993627e+3, -0.23152937917604549567536039109e+3,
        0.35763911791061412378285349910e+3, 0.93405324183624310003907691704e+2,
        -0.37458323136451633156875139351e+2, 0.10409964950896230045147246184e+3,
        0.29840293426660503123344363579e+2, -0.43533456590011143754432175058e+2,
        0.96324553959188282948394950600e+2, -0.39177261675615439165231486172e+2,
        -0.14972683625798562581422125276e+3,
    ),
)

# fmt: on

DOPRI8 = ButcherTableau(
    name="Dopri8",
    reference=(
        "P. J. Prince, J. R. Dormand, High order embedded Runge-Kutta formulae, "
        "Journal of Computational and Applied Mathematics 7(1) (1981) 67-75; "
        "as DOP853 in E. Hairer, S. P. Norsett, G. Wanner, Solving Ordinary "
        "Differential Equations I, 2nd ed., Springer, 1993, Sec. II.10"
    ),
    order=8,
    a=(*_DOP853_A, _DOP853_B),
    b=(*_DOP853_B, 0.0),
    c=(*_DOP853_C, 1.0),
    b_error=(*_DOP853_E5, 0.0),
    error_order=7,
    b_error3=(*(x - y for x, y in zip(_DOP853_B, _DOP853_B_HAT3, strict=True)), 0.0),
    fsal=True,
    dense=_nested_dense([*_hermite_blocks(_DOP853_B, 16, 12), *_DOP853_D], degree=7),
    dense_order=7,
    a_extra=_DOP853_A_EXTRA,
    c_extra=_DOP853_C_EXTRA,
)

ALL_TABLEAUS = (EULER, MIDPOINT, HEUN, RK4, BOSH3, TSIT5, DOPRI5, DOPRI8)
