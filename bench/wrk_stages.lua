-- wrk_stages.lua - as wrk_post.lua (POSTs the raw body in WRK_BODY), and reads each answer's
-- Server-Timing: at the end it prints the daemon's own stage times (recv, decode, queue,
-- h2d, kernel, d2h, encode, total) at p50, p99, p99.9 and max over every answer, and the
-- same for the answers whose total was at least WRK_SLOW_MS (default 2) milliseconds.
-- Its response() callback costs wrk a copy of every answer into Lua (client CPU beside the
-- server's): read the daemon's stage times here, and wrk's rate and latency from a run of
-- wrk_post.lua.
-- the request is wrk_post.lua's, read from beside this file; done() below replaces its own
dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "wrk_post.lua")

local stages = {"recv", "decode", "queue", "h2d", "kernel", "d2h", "encode", "total"}
local threads = {}
-- Stage times go into histograms of 5% wide buckets (wrk copies only flat tables between
-- its threads): bucket i holds times around 1.05^i microseconds.
local GROW = math.log(1.05)

function setup(thread)
   table.insert(threads, thread)
end

function init(args)
   slow_ms = tonumber(os.getenv("WRK_SLOW_MS") or "2") or 2
   for _, s in ipairs(stages) do
      _G["h_" .. s], _G["hs_" .. s] = {}, {}
      _G["max_" .. s], _G["maxs_" .. s], _G["sum_" .. s], _G["sums_" .. s] = 0, 0, 0, 0
   end
   untimed = 0
end

local function bucket(ms)
   local us = ms * 1000
   return us < 1 and 0 or math.floor(math.log(us) / GROW + 0.5)
end

local function add(prefix, s, v)
   local h = _G["h" .. prefix .. "_" .. s]
   local b = bucket(v)
   h[b] = (h[b] or 0) + 1
   if v > _G["max" .. prefix .. "_" .. s] then _G["max" .. prefix .. "_" .. s] = v end
   _G["sum" .. prefix .. "_" .. s] = _G["sum" .. prefix .. "_" .. s] + v
end

function response(status, headers, body)
   local st = headers["Server-Timing"] or headers["server-timing"]
   if not st then untimed = untimed + 1; return end
   local got = {}
   for name, dur in st:gmatch("(%a+);dur=([%d%.]+)") do got[name] = tonumber(dur) end
   if not got.total then untimed = untimed + 1; return end
   local is_slow = got.total >= slow_ms
   for _, s in ipairs(stages) do
      add("", s, got[s] or 0)
      if is_slow then add("s", s, got[s] or 0) end
   end
end

-- the time at the p-th fraction of a merged histogram (ms, the bucket's middle)
local function pct(h, n, p)
   local keys = {}
   for b in pairs(h) do keys[#keys + 1] = b end
   table.sort(keys)
   local want, seen = math.max(1, math.ceil(p * n)), 0
   for _, b in ipairs(keys) do
      seen = seen + h[b]
      if seen >= want then return b == 0 and 0 or math.exp(b * GROW) / 1000 end
   end
   return 0
end

local function report(title, prefix)
   io.write(title .. "\n")
   local lines, n = {}, 0
   for _, s in ipairs(stages) do
      local h, mx, sum = {}, 0, 0
      for _, t in ipairs(threads) do
         for b, c in pairs(t:get("h" .. prefix .. "_" .. s)) do h[b] = (h[b] or 0) + c end
         mx = math.max(mx, t:get("max" .. prefix .. "_" .. s))
         sum = sum + t:get("sum" .. prefix .. "_" .. s)
      end
      local cnt = 0
      for _, c in pairs(h) do cnt = cnt + c end
      n = cnt
      if cnt > 0 then
         lines[#lines + 1] = string.format("| %s | %.3f | %.3f | %.3f | %.3f | %.3f |", s, math.min(pct(h, cnt, 0.5), mx),
                                           math.min(pct(h, cnt, 0.99), mx), math.min(pct(h, cnt, 0.999), mx), mx, sum / cnt)
      end
   end
   io.write(string.format("%d answers (times within 5%%)\n", n))
   if n == 0 then return end
   io.write("| stage | p50 ms | p99 ms | p99.9 ms | max ms | mean ms |\n| --- | ---: | ---: | ---: | ---: | ---: |\n")
   io.write(table.concat(lines, "\n") .. "\n")
end

function done(summary, latency, requests)
   io.write(string.format("non200: %d\n", summary.errors.status))
   io.write(string.format("wrk latency: p50 %.3f ms, p99 %.3f ms, p99.9 %.3f ms, max %.3f ms\n",
                          latency:percentile(50) / 1000, latency:percentile(99) / 1000,
                          latency:percentile(99.9) / 1000, latency.max / 1000))
   local untimed_all = 0
   for _, t in ipairs(threads) do untimed_all = untimed_all + (t:get("untimed") or 0) end
   if untimed_all > 0 then io.write(string.format("answers without Server-Timing: %d\n", untimed_all)) end
   report("the daemon's stages, every answer:", "")
   report(string.format("the daemon's stages, answers with total >= %s ms:", os.getenv("WRK_SLOW_MS") or "2"), "s")
end
