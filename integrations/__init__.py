"""Integrations where another framework owns the weights and forge supplies rollouts and data.

    verl/   veRL: forge's harness rollouts as a veRL agent loop, and veRL datasets and rewards
"""
