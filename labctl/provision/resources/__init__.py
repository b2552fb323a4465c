"""Every built-in resource, one module per kind of thing it manages.

Importing this package imports none of them: `labctl.provision.resource.RESOURCES` names each
type's class as "module:class", and a module is imported when a playbook uses its type.
"""
