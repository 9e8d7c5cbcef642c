// Preloaded with `node --require` so a third-party server that listens on every interface
// (express's app.listen(PORT)) binds to loopback only while the tests run it.
const net = require("net");
const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  if (typeof args[0] === "number" || (typeof args[0] === "string" && /^\d+$/.test(args[0]))) {
    if (typeof args[1] !== "string") args.splice(1, 0, "127.0.0.1");
  }
  return listen.apply(this, args);
};
