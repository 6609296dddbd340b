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


# ---------------------------------------------------------------------- the link density itself
# ``Likelihood.log_link(..., theta_prev=...)``: the density of a carried node's parameter under
# both links, the normalised product that ``log_marginal`` integrates against and
# ``sample_node_theta(..., theta_prev=...)`` draws from. Each is checked against quadrature: the
# density integrates to 1, is proportional to the product of the two links, and the collapsed
# marginal is the integral of the density times the documents' likelihood.


def test_vmf_link_under_both_links_is_the_normalised_product():
    p, beta, depth = 3, 4.0, 2
    lik = VonMisesFisher(VARIANT, p, kappa0=3.0, kappa1=0.8, a=0.5, min_node_docs=2,
                         concentration_bounds=(1e-3, 1e6))
    par, tim = lik.link_strengths(np.array([depth]))
    mu_par, mu_prev = _unit([1.0, 0.2, 0.0]), _unit([0.0, 1.0, 0.5])
    X = np.stack([_unit([1.0, 1.0, 0.0]), _unit([0.0, 0.4, 1.0])])
    docs = DocumentSet(2.0, X.sum(axis=0))

    def point(u, phi):
        s = np.sqrt(1.0 - u * u)
        return np.array([s * np.cos(phi), s * np.sin(phi), u])

    def density(u, phi):
        return np.exp(lik.log_link(point(u, phi), mu_par, depth, theta_prev=mu_prev))

    def joint(u, phi):
        return density(u, phi) * np.exp(lik.log_likelihood(docs, point(u, phi), beta))

    total = integrate.dblquad(density, 0.0, 2 * np.pi, -1.0, 1.0, epsabs=0, epsrel=1e-10)[0]
    assert total == pytest.approx(1.0, rel=1e-8)
    mass = integrate.dblquad(joint, 0.0, 2 * np.pi, -1.0, 1.0, epsabs=0, epsrel=1e-10)[0]
    assert np.log(mass) == pytest.approx(lik.log_marginal(docs, mu_par, beta, depth, theta_prev=mu_prev), rel=1e-8)
    # proportional to the product of the links: the log difference is the same at two points
    a, b = point(0.3, 1.0), point(-0.6, 4.0)
    diff = (lik.log_link(a, mu_par, depth, theta_prev=mu_prev) - lik.log_link(b, mu_par, depth, theta_prev=mu_prev))
    assert diff == pytest.approx(par[0] * mu_par @ (a - b) + tim[0] * mu_prev @ (a - b), rel=1e-10)
    # without the previous parameter: the parent link alone, as before
    assert lik.log_link(a, mu_par, depth) == pytest.approx(log_normalizer(p, par[0]) + par[0] * mu_par @ a)


def test_multinomial_link_under_both_links_is_the_linked_dirichlet():
    depth = 1
    lik = Multinomial(VARIANT, 2, kappa0=5.0, kappa1=0.8, a=0.5, min_node_docs=2)
    par, tim = lik.link_strengths(np.array([depth]))
    phi_par, phi_prev = np.array([0.7, 0.3]), np.array([0.2, 0.8])
    alpha = par[0] * phi_par + tim[0] * phi_prev + lik.floor
    s = np.array([4.0, 9.0])

    def density(f):
        return np.exp(lik.log_link(np.array([f, 1.0 - f]), phi_par, depth, theta_prev=phi_prev))

    assert integrate.quad(density, 0.0, 1.0, epsabs=0, epsrel=1e-12)[0] == pytest.approx(1.0, rel=1e-9)
    f = 0.35
    want = gammaln(alpha.sum()) - gammaln(alpha).sum() + (alpha - 1.0) @ np.log([f, 1.0 - f])
    assert lik.log_link(np.array([f, 1.0 - f]), phi_par, depth, theta_prev=phi_prev) == pytest.approx(want, rel=1e-12)
    mass = integrate.quad(lambda f: density(f) * f ** s[0] * (1.0 - f) ** s[1], 0.0, 1.0, epsabs=0, epsrel=1e-12)[0]
    got = lik.log_marginal(DocumentSet(2.0, s), phi_par, par[0], depth, theta_prev=phi_prev)
    assert np.log(mass) == pytest.approx(got, rel=1e-9)
    # the conditional draw given both links and documents: Beta(alpha + s), mean and variance
    rng = np.random.default_rng(0)
    draws = np.array([lik.sample_node_theta(phi_par, par[0], depth, DocumentSet(2.0, s), rng, theta_prev=phi_prev)[0]
                      for _ in range(20000)])
    post = alpha + s
    mean = post[0] / post.sum()
    sd = np.sqrt(mean * (1 - mean) / (post.sum() + 1))
    assert abs(draws.mean() - mean) < 4 * sd / np.sqrt(draws.size)
    assert draws.std() == pytest.approx(sd, rel=0.05)


def test_gaussian_link_under_both_links_is_the_normalised_product():
    depth = 1
    lik = Gaussian(VARIANT, 1, sigma0=2.0, sigma1=0.5, eta=0.9, a=0.5, noise_var=None, min_node_docs=2)
    par, tim = lik.link_strengths(np.array([depth]))
    m_par, m_prev, noise = np.array([0.5]), np.array([-1.0]), 0.3
    x = np.array([0.1, 0.4, -0.2])
    docs = DocumentSet(3.0, np.array([x.sum()]), float(x @ x))

    def density(t):
        return np.exp(lik.log_link(np.array([t]), m_par, depth, theta_prev=m_prev))

    assert integrate.quad(density, -30, 30, epsabs=0, epsrel=1e-12)[0] == pytest.approx(1.0, rel=1e-9)
    ratio = np.log(density(0.7) / density(-0.4))
    want = (-((0.7 - m_par[0]) ** 2 - (-0.4 - m_par[0]) ** 2) / (2 * par[0])
            - ((0.7 - lik.eta * m_prev[0]) ** 2 - (-0.4 - lik.eta * m_prev[0]) ** 2) / (2 * tim[0]))
    assert ratio == pytest.approx(want, rel=1e-9)
    joint = integrate.quad(lambda t: density(t) * np.exp(lik.log_likelihood(docs, np.array([t]), 1.0 / noise)),
                           -30, 30, epsabs=0, epsrel=1e-12)[0]
    got = lik.log_marginal(docs, m_par, 1.0 / noise, depth, theta_prev=m_prev)
    assert np.log(joint) == pytest.approx(got, rel=1e-9)
    # the conditional draw given both links and documents: its mean and variance by quadrature
    post = lambda t: density(t) * np.exp(lik.log_likelihood(docs, np.array([t]), 1.0 / noise)) / joint  # noqa: E731
    mean = integrate.quad(lambda t: t * post(t), -30, 30, epsrel=1e-12)[0]
    var = integrate.quad(lambda t: (t - mean) ** 2 * post(t), -30, 30, epsrel=1e-12)[0]
    rng = np.random.default_rng(1)
    draws = np.array([lik.sample_node_theta(m_par, 1.0 / noise, depth, docs, rng, theta_prev=m_prev)[0]
                      for _ in range(20000)])
    assert abs(draws.mean() - mean) < 4 * np.sqrt(var / draws.size)
    assert draws.var() == pytest.approx(var, rel=0.05)


def test_vmf_draw_under_both_links_on_the_circle():
    p, depth, beta = 2, 1, 3.0
    lik = VonMisesFisher(VARIANT, p, kappa0=3.0, kappa1=0.8, a=0.5, min_node_docs=2,
                         concentration_bounds=(1e-3, 1e6))
    mu_par, mu_prev = _unit([1.0, 0.0]), _unit([0.0, 1.0])
    docs = DocumentSet(1.0, _unit([-1.0, 0.3]))

    def post(phi):
        th = np.array([np.cos(phi), np.sin(phi)])
        return np.exp(lik.log_link(th, mu_par, depth, theta_prev=mu_prev) + lik.log_likelihood(docs, th, beta))

    z = integrate.quad(post, -np.pi, np.pi, epsrel=1e-12)[0]
    assert np.log(z) == pytest.approx(lik.log_marginal(docs, mu_par, beta, depth, theta_prev=mu_prev), rel=1e-9)
    mean = np.array([integrate.quad(lambda f: np.cos(f) * post(f) / z, -np.pi, np.pi)[0],
                     integrate.quad(lambda f: np.sin(f) * post(f) / z, -np.pi, np.pi)[0]])
    rng = np.random.default_rng(2)
    draws = np.array([lik.sample_node_theta(mu_par, beta, depth, docs, rng, theta_prev=mu_prev) for _ in range(20000)])
    assert np.allclose(draws.mean(axis=0), mean, atol=4 / np.sqrt(draws.size))
