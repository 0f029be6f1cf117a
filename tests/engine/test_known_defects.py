"""The defects of the next engine step, each as the example it was found with.

Every test here is a strict ``xfail``: it states what must hold and fails today for a
named mechanism. A fix makes it pass, which fails the run until its marker goes -- so
none of these can be fixed, or broken further, without this file saying so.
"""

from __future__ import annotations
