-- wrk_post.lua - POSTs one raw-binary body (the file in WRK_BODY) to the URL wrk was given,
-- with Content-Type application/octet-stream. Used by bench/ceiling.sh.
local path = os.getenv("WRK_BODY")
local f = assert(io.open(path, "rb"), "WRK_BODY must name a readable file")
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "application/octet-stream"

-- Count answers that are not 200: a server that fails fast must not look fast.
local bad = 0
function response(status, headers, body)
   if status ~= 200 then bad = bad + 1 end
end

function done(summary, latency, requests)
   io.write(string.format("non200: %d\n", summary.errors.status))
end
