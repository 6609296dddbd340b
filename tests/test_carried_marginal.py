"""A carried node's collapsed marginal under both its links, against numerical integration.

``Likelihood.log_marginal(..., theta_prev=...)`` integrates the node's parameter out under its
full conditional prior (parent link times time link, normalised); each family is checked in a
dimension where the integral can be done by quadrature.
"""

import numpy as np
import pytest
from scipy import integrate
from scipy.special import gammaln

from streamtree.likelihoods.base import DocumentSet
from streamtree.likelihoods.gaussian import Gaussian
from streamtree.likelihoods.multinomial import Multinomial
from streamtree.likelihoods.vmf import VonMisesFisher, log_normalizer
from streamtree.variants import resolve_variant

VARIANT = resolve_variant("dtssbp", window=2, max_depth=3, gamma=0.5, xi=0.001)


def _unit(v):
    v = np.asarray(v, dtype=float)
    return v / np.linalg.norm(v)


def test_vmf_on_the_sphere():
    p, beta, depth = 3, 4.0, 2
    lik = VonMisesFisher(VARIANT, p, kappa0=3.0, kappa1=0.8, a=0.5, min_node_docs=2,
                         concentration_bounds=(1e-3, 1e6))
    par, tim = lik.link_strengths(np.array([depth]))
    mu_par, mu_prev = _unit([1.0, 0.2, 0.0]), _unit([0.0, 1.0, 0.5])
    X = np.stack([_unit([1.0, 1.0, 0.0]), _unit([0.3, 1.0, 0.2]), _unit([0.0, 0.4, 1.0])])

    def integrand(u, phi):  # u = cos(polar angle): the area element is du dphi
        s = np.sqrt(1.0 - u * u)
        th = np.array([s * np.cos(phi), s * np.sin(phi), u])
        prior = np.exp(par[0] * mu_par @ th + tim[0] * mu_prev @ th)
        like = np.exp(X.shape[0] * log_normalizer(p, beta) + beta * X.sum(axis=0) @ th)
        return prior * like

    def prior_mass(u, phi):
        s = np.sqrt(1.0 - u * u)
        th = np.array([s * np.cos(phi), s * np.sin(phi), u])
        return np.exp(par[0] * mu_par @ th + tim[0] * mu_prev @ th)

    num = integrate.dblquad(integrand, 0.0, 2 * np.pi, -1.0, 1.0, epsabs=0, epsrel=1e-10)[0]
    den = integrate.dblquad(prior_mass, 0.0, 2 * np.pi, -1.0, 1.0, epsabs=0, epsrel=1e-10)[0]
    docs = DocumentSet(3.0, X.sum(axis=0))
    got = lik.log_marginal(docs, mu_par, beta, depth, theta_prev=mu_prev)
    assert got == pytest.approx(np.log(num / den), rel=1e-8)
    # the time link matters: without it the value differs
    assert abs(lik.log_marginal(docs, mu_par, beta, depth) - got) > 1e-3


def test_multinomial_on_two_words():
    depth = 1
    lik = Multinomial(VARIANT, 2, kappa0=5.0, kappa1=1.0, a=0.0, min_node_docs=2)
    par, tim = lik.link_strengths(np.array([depth]))
    phi_par, phi_prev = np.array([0.7, 0.3]), np.array([0.2, 0.8])
    alpha = par[0] * phi_par + tim[0] * phi_prev + lik.floor
    s = np.array([4.0, 9.0])

    def integrand(f):  # Beta(alpha) density times f^s1 (1 - f)^s2
        log_beta = gammaln(alpha.sum()) - gammaln(alpha).sum()
        return np.exp(log_beta + (alpha[0] - 1 + s[0]) * np.log(f) + (alpha[1] - 1 + s[1]) * np.log1p(-f))

    want = np.log(integrate.quad(integrand, 0.0, 1.0, epsabs=0, epsrel=1e-12)[0])
    got = lik.log_marginal(DocumentSet(2.0, s), phi_par, par[0], depth, theta_prev=phi_prev)
    assert got == pytest.approx(want, rel=1e-9)
    assert abs(lik.log_marginal(DocumentSet(2.0, s), phi_par, par[0], depth) - got) > 1e-3


def test_gaussian_in_one_dimension():
    depth = 1
    lik = Gaussian(VARIANT, 1, sigma0=2.0, sigma1=0.5, eta=0.9, a=0.5, noise_var=None, min_node_docs=2)
    par, tim = lik.link_strengths(np.array([depth]))
    m_par, m_prev, noise = np.array([0.5]), np.array([-1.0]), 0.3
    x = np.array([0.1, 0.4, -0.2])

    def normal(z, mean, var):
        return np.exp(-(z - mean) ** 2 / (2 * var)) / np.sqrt(2 * np.pi * var)

    def integrand(t):
        return (normal(t, m_par[0], par[0]) * normal(t, lik.eta * m_prev[0], tim[0])
                * np.prod(normal(x, t, noise)))

    def prior_mass(t):
        return normal(t, m_par[0], par[0]) * normal(t, lik.eta * m_prev[0], tim[0])

    num = integrate.quad(integrand, -30, 30, epsabs=0, epsrel=1e-12)[0]
    den = integrate.quad(prior_mass, -30, 30, epsabs=0, epsrel=1e-12)[0]
    docs = DocumentSet(3.0, np.array([x.sum()]), float(x @ x))
    got = lik.log_marginal(docs, m_par, 1.0 / noise, depth, theta_prev=m_prev)
    assert got == pytest.approx(np.log(num / den), rel=1e-9)
    assert abs(lik.log_marginal(docs, m_par, 1.0 / noise, depth) - got) > 1e-3
