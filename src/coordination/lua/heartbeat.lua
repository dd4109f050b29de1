-- Be counted, report the carry, see the state: the preamble alone. Reply: the view.
local s = preamble()
return view(s.h, s.now)
