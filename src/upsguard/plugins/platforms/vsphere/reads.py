"""Reading properties through a PropertyCollector: every object of a view, or given objects.

One ``RetrievePropertiesEx`` (then ``ContinueRetrievePropertiesEx`` for further
pages) reads any number of objects in one round trip; the inventory, the watch's
polls and the fresh power-state checks all read this way. Reads of scalars take
the lean path when given one (see ``lean``), and pyVmomi's otherwise.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from pyVmomi import VmomiSupport, vmodl

from upsguard.plugins.platforms.vsphere.lean import MAX_OBJECTS, Found, LeanRequests

PC: Any = vmodl.query.PropertyCollector  # pyVmomi's classes are untyped
wsdl_name: Any = VmomiSupport.GetWsdlName  # a type's name in the API (``VirtualMachine``)
Props = dict[str, Any]
#: Managed object type (``vim.VirtualMachine``) -> the property paths to read of it.
Paths = Mapping[Any, list[str]]


def moid(obj: Any) -> str:
    """A managed object's id (``vm-42``).

    ``_GetMoId`` is public: pyVmomi names its own methods with a leading underscore
    so that they never clash with vSphere's, and documents them as supported.
    """
    return str(obj._GetMoId())


def read_view(collector: Any, view: Any, paths: Paths, lean: LeanRequests | None = None) -> Found:
    """Scalar properties of every object in ``view`` (a ContainerView or a ListView)."""
    return _scalars(collector, view_filter(view, paths), lean)


def view_filter(view: Any, paths: Paths) -> Any:
    """A filter over every object in ``view`` (a ContainerView or a ListView), for reads
    and for update waits alike."""
    traverse = PC.TraversalSpec(name="view", path="view", skip=False, type=type(view))
    return PC.FilterSpec(
        objectSet=[PC.ObjectSpec(obj=view, skip=True, selectSet=[traverse])],
        propSet=[PC.PropertySpec(type=kind, pathSet=props) for kind, props in paths.items()],
    )


def read_objects(
    collector: Any, objects: Iterable[Any], paths: Paths, lean: LeanRequests | None = None
) -> tuple[dict[str, Props], set[str]]:
    """Scalar properties of the given managed objects, and the ids vSphere no longer knows.

    An object that no longer exists (deleted meanwhile) fails the whole read: it is
    left out, and the read is made again without it.
    """
    wanted = {moid(obj): obj for obj in objects}
    gone: set[str] = set()
    while wanted:
        spec = PC.FilterSpec(
            objectSet=[PC.ObjectSpec(obj=obj, skip=False) for obj in wanted.values()],
            propSet=[PC.PropertySpec(type=kind, pathSet=props) for kind, props in paths.items()],
        )
        try:
            found = _scalars(collector, spec, lean)
        except vmodl.fault.ManagedObjectNotFound as exc:
            missing = moid(exc.obj) if exc.obj is not None else None
            if missing not in wanted:
                raise
            del wanted[missing]
            gone.add(missing)
        else:
            return {ref: props for ref, (_, props) in found.items()}, gone
    return {}, gone


def _scalars(collector: Any, spec: Any, lean: LeanRequests | None) -> Found:
    if lean is not None:
        found = lean.retrieve(collector, spec)
        if found is not None:
            return found
    return {moid(c.obj): (wsdl_name(type(c.obj)), props_of(c)) for c in retrieve(collector, spec)}


def retrieve(collector: Any, spec: Any) -> list[Any]:
    """Every ObjectContent the filter selects, from all pages."""
    return [content for page in pages(collector, spec) for content in page]


def pages(collector: Any, spec: Any) -> Iterator[list[Any]]:
    """The ObjectContents the filter selects, one page (one round trip) at a time."""
    result = collector.RetrievePropertiesEx([spec], PC.RetrieveOptions(maxObjects=MAX_OBJECTS))
    while result is not None:
        yield list(result.objects or [])
        if not result.token:
            return
        result = collector.ContinueRetrievePropertiesEx(result.token)


def props_of(content: Any) -> Props:
    """One ObjectContent's properties: path -> value."""
    return {p.name: p.val for p in content.propSet or []}
