"""Any pytree class as a flax state dict, for checkpoints.

flax's ``to_state_dict`` / ``from_state_dict`` know dicts, lists, tuples and flax's own
structs; an environment's state may hold other pytree classes (MuJoCo's ``mjx.Data``
in Playground's and brax's mjx states). :func:`serializable` registers each one it
finds as the dict of its pytree children, before a state is saved or restored.
"""

from __future__ import annotations

import flax.serialization
import jax


def _child_name(entry) -> str:
    """A pytree key entry (an attribute, a dict key, an index) as a state-dict key."""
    # jax.tree_util's key entries (foreign objects): by their type
    if isinstance(entry, jax.tree_util.GetAttrKey):
        return str(entry.name)
    if isinstance(entry, jax.tree_util.DictKey | jax.tree_util.FlattenedIndexKey):
        return str(entry.key)
    if isinstance(entry, jax.tree_util.SequenceKey):
        return str(entry.idx)
    return str(entry)


def _children(node):
    flat, treedef = jax.tree_util.tree_flatten_with_path(node, is_leaf=lambda y: y is not node)
    if jax.tree_util.treedef_is_leaf(treedef):
        return [], treedef
    return [(_child_name(path[0]), child) for path, child in flat], treedef


def _node_to_dict(node) -> dict:
    return {name: flax.serialization.to_state_dict(c) for name, c in _children(node)[0]}


def _node_from_dict(node, state: dict):
    children, treedef = _children(node)
    restored = [flax.serialization.from_state_dict(c, state[name]) for name, c in children]
    return treedef.unflatten(restored)


def serializable(tree) -> None:
    """Makes flax's state dicts know every pytree class in ``tree`` that it does not (an
    environment's own state types, such as MuJoCo's ``mjx.Data`` in Playground's and
    brax's mjx states): such a node is the dict of its pytree children."""
    known = flax.serialization._STATE_DICT_REGISTRY  # no public query

    def visit(node):
        if isinstance(node, dict):
            node = list(node.values())
        if node is None or isinstance(node, (list, tuple)):
            for child in node or ():
                visit(child)
            return
        children, treedef = _children(node)
        if jax.tree_util.treedef_is_leaf(treedef):
            return
        if type(node) not in known:
            flax.serialization.register_serialization_state(
                type(node), _node_to_dict, _node_from_dict
            )
        for _, child in children:
            visit(child)

    visit(tree)
