-- wrk_post.lua - POSTs one raw-binary body (the file in WRK_BODY) to the URL wrk was given,
-- with Content-Type application/octet-stream. Used by bench/ceiling.sh and bench/rounds.sh.
--
-- No response() callback: with one, wrk copies every answer's headers and body into Lua,
-- client work that competes with the server for the host's cores; the count of answers
-- with a status of 400 or above is wrk's own (summary.errors.status), printed by done().
local path = os.getenv("WRK_BODY")
local f = assert(io.open(path, "rb"), "WRK_BODY must name a readable file")
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "application/octet-stream"

function done(summary, latency, requests)
   io.write(string.format("non200: %d\n", summary.errors.status))
end
