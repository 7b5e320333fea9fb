using System;
using System.Runtime.InteropServices;

namespace H2o
{
    /// <summary>An h2o_model pointer, freed once by the runtime even if Dispose is never called.</summary>
    internal sealed class ModelHandle : SafeHandle
    {
        public ModelHandle() : base(IntPtr.Zero, true) { }
        public override bool IsInvalid => handle == IntPtr.Zero;

        internal static ModelHandle From(IntPtr p)
        {
            var h = new ModelHandle();
            h.SetHandle(p);
            return h;
        }

        protected override bool ReleaseHandle()
        {
            Native.h2o_model_free(handle);
            return true;
        }
    }

    /// <summary>An h2o_session pointer. It also references the model handle: the library keeps
    /// the model alive for its sessions anyway, and the reference keeps the managed object
    /// reachable for as long as the session is, whatever order finalizers run in.</summary>
    internal sealed class SessionHandle : SafeHandle
    {
        internal ModelHandle Model;
        public SessionHandle() : base(IntPtr.Zero, true) { }
        public override bool IsInvalid => handle == IntPtr.Zero;

        internal static SessionHandle From(IntPtr p, ModelHandle model)
        {
            var h = new SessionHandle { Model = model };
            h.SetHandle(p);
            return h;
        }

        protected override bool ReleaseHandle()
        {
            Native.h2o_session_free(handle);
            return true;
        }
    }
}
