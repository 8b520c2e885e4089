"""OpenES on a team: three agents spreading over three landmarks (MPE simple_spread).

    python examples/openes_team.py [--devices 2]

A candidate is the whole team: one 16-unit MLP per agent (``team='per_agent'``;
``'shared'`` gives every agent the same network, told apart by a one-hot id),
scored by the sum of the agents' rewards over a 25-step episode. Writes
runs/examples/openes-team and figures/openes_team.png.
"""

from evorl_pop.run import script

args = script.start(__doc__, generations=40)

from evorl_pop.algorithms.es import ESConfig  # noqa: E402

es = ESConfig(strategy="Open_ES", task="marl/MPE_simple_spread_v3", team="per_agent",
              population_size=64, learning_rate=0.05, sigma_init=0.1, hidden_sizes=(16,),
              episodes=2, eval_episodes=16)  # fmt: skip
results = script.train(args, {"openes-team": es}, "openes_team.png",
                       "OpenES on MPE simple_spread, a team of 3 per candidate",
                       metrics=("best", "mean", "worst", "eval_return"), x="steps", chunk=10,
                       checkpoint_every=0)  # fmt: skip
for name, result in results.items():
    ret = result.history["eval_return"]
    print(f"{name}: the mean team's return {ret[0]:.1f} at generation 1, {ret[-1]:.1f} at the end")
