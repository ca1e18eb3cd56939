-- wrk_post.lua - POSTs one raw-binary body (the file in WRK_BODY) to the URL wrk was given,
-- with Content-Type application/octet-stream, and prints "non200: N" at the end: the
-- answers with a status of 400 or above (wrk's own count). Used by bench/load.py.
--
-- WRK_STAGES=1 also reads every answer: the daemon's stage times from its Server-Timing
-- (recv, decode, queue, h2d, kernel, d2h, encode, total) at p50, p99, p99.9 and max, and
-- how many answers ran coalesced (X-Gemm-Batched). That costs wrk a copy of every answer
-- into Lua, client work that competes with the server for the cores: take the daemon's
-- stage times from such a run, and rates and latencies from a run without it.
local f = assert(io.open(os.getenv("WRK_BODY") or "", "rb"), "WRK_BODY must name a readable file")
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "application/octet-stream"

local stages = {"recv", "decode", "queue", "h2d", "kernel", "d2h", "encode", "total"}
local threads = {}
-- Stage times go into histograms of 5% wide buckets (one flat table a stage: wrk copies
-- only flat tables between its threads): bucket i holds times around 1.05^i microseconds.
local GROW = math.log(1.05)

function setup(thread)
   table.insert(threads, thread)
end

if os.getenv("WRK_STAGES") == "1" then
   function init(args)
      untimed, coalesced = 0, 0
      for _, s in ipairs(stages) do _G["h_" .. s], _G["max_" .. s] = {}, 0 end
   end

   function response(status, headers, body)
      local st = headers["Server-Timing"] or headers["server-timing"] or ""
      local b = headers["X-Gemm-Batched"] or headers["x-gemm-batched"] or ""
      if b:find("coalesced") then coalesced = coalesced + 1 end
      local got = {}
      for name, dur in st:gmatch("(%a+);dur=([%d%.]+)") do got[name] = tonumber(dur) end
      if not got.total then untimed = untimed + 1; return end
      for _, s in ipairs(stages) do
         local v = got[s] or 0
         local i = v * 1000 < 1 and 0 or math.floor(math.log(v * 1000) / GROW + 0.5)
         local h = _G["h_" .. s]
         h[i] = (h[i] or 0) + 1
         if v > _G["max_" .. s] then _G["max_" .. s] = v end
      end
   end
end

-- the time (ms, a bucket's middle) below which a fraction p of the counts in h lie
local function pct(h, n, p)
   local keys, seen = {}, 0
   for b in pairs(h) do keys[#keys + 1] = b end
   table.sort(keys)
   for _, b in ipairs(keys) do
      seen = seen + h[b]
      if seen >= math.max(1, math.ceil(p * n)) then return b == 0 and 0 or math.exp(b * GROW) / 1000 end
   end
   return 0
end

function done(summary, latency, requests)
   io.write(string.format("non200: %d\n", summary.errors.status))
   if os.getenv("WRK_STAGES") ~= "1" then return end
   local untimed, coalesced, answers = 0, 0, 0
   for _, t in ipairs(threads) do
      untimed = untimed + t:get("untimed")
      coalesced = coalesced + t:get("coalesced")
   end
   io.write("| stage | p50 ms | p99 ms | p99.9 ms | max ms |\n| --- | ---: | ---: | ---: | ---: |\n")
   for _, s in ipairs(stages) do
      local h, mx, n = {}, 0, 0
      for _, t in ipairs(threads) do
         for b, c in pairs(t:get("h_" .. s)) do h[b] = (h[b] or 0) + c; n = n + c end
         mx = math.max(mx, t:get("max_" .. s))
      end
      answers = n
      if n > 0 and mx > 0 then
         io.write(string.format("| %s | %.3f | %.3f | %.3f | %.3f |\n", s, math.min(pct(h, n, 0.5), mx),
                                math.min(pct(h, n, 0.99), mx), math.min(pct(h, n, 0.999), mx), mx))
      end
   end
   io.write(string.format("stages: %d answers timed (within 5%%), %d without Server-Timing, %d coalesced\n",
                          answers, untimed, coalesced))
end
